//! espeak-ng, the phonemizer Piper voices were trained with, opened at run time.
//!
//! The library keeps global state (one selected voice, one text being read), so the process
//! holds a single instance behind a mutex and every call goes through it. Opening it with
//! libloading rather than linking keeps the plugin loadable on a machine without espeak-ng (the
//! voice load then says what to install) and lets us use `espeak_TextToPhonemesWithTerminator`
//! when a newer espeak-ng has it, falling back to reading the punctuation off the text.

use crate::phonemize::{clause_end_from_code, clause_end_from_text, Clause};
use libloading::Library;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Debian's runtime package (`libespeak-ng1`) ships only the versioned name.
const LIBRARY_NAMES: &[&str] = &["libespeak-ng.so.1", "libespeak-ng.so"];

const AUDIO_OUTPUT_SYNCHRONOUS: c_int = 2;
/// Without it a failed initialisation calls exit() in the host.
const INITIALIZE_DONT_EXIT: c_int = 0x8000;
const CHARS_UTF8: c_int = 1;
const PHONEMES_IPA: c_int = 0x02;

type InitializeFn = unsafe extern "C" fn(c_int, c_int, *const c_char, c_int) -> c_int;
type SetVoiceFn = unsafe extern "C" fn(*const c_char) -> c_int;
type InfoFn = unsafe extern "C" fn(*mut *const c_char) -> *const c_char;
type ToPhonemesFn = unsafe extern "C" fn(*mut *const c_void, c_int, c_int) -> *const c_char;
type ToPhonemesTermFn = unsafe extern "C" fn(*mut *const c_void, c_int, c_int, *mut c_int) -> *const c_char;

struct Espeak {
    set_voice: SetVoiceFn,
    to_phonemes: ToPhonemesFn,
    to_phonemes_term: Option<ToPhonemesTermFn>,
    voice: Option<String>,
    info: EspeakInfo,
    // Last: the function pointers above are only valid while the library is open.
    _library: Library,
}

// SAFETY: espeak-ng may be called from any thread as long as calls do not overlap, which the
// mutex around the only instance guarantees.
unsafe impl Send for Espeak {}

#[derive(Clone, Debug)]
pub struct EspeakInfo {
    pub library: PathBuf,
    pub version: String,
    pub data_path: String,
    /// Whether the clause punctuation comes from espeak-ng itself.
    pub terminator_api: bool,
}

static ESPEAK: Mutex<Option<Espeak>> = Mutex::new(None);

fn lock() -> std::sync::MutexGuard<'static, Option<Espeak>> {
    ESPEAK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Opens and initialises espeak-ng once per process (later calls return the first's info):
/// `library` is a path or name to open instead of the system's, `data` the espeak-ng-data
/// folder instead of the one the library was built with.
pub fn init(library: Option<&Path>, data: Option<&Path>) -> Result<EspeakInfo, String> {
    let mut guard = lock();
    if let Some(e) = guard.as_ref() {
        return Ok(e.info.clone());
    }
    let (lib, path) = open(library)?;
    // SAFETY: the symbols have the signatures of espeak-ng's speak_lib.h (API revision 12).
    let espeak = unsafe {
        let initialize: InitializeFn = *lib.get(b"espeak_Initialize\0").map_err(|e| e.to_string())?;
        let info: InfoFn = *lib.get(b"espeak_Info\0").map_err(|e| e.to_string())?;
        let set_voice: SetVoiceFn = *lib.get(b"espeak_SetVoiceByName\0").map_err(|e| e.to_string())?;
        let to_phonemes: ToPhonemesFn = *lib.get(b"espeak_TextToPhonemes\0").map_err(|e| e.to_string())?;
        let to_phonemes_term: Option<ToPhonemesTermFn> =
            lib.get(b"espeak_TextToPhonemesWithTerminator\0").ok().map(|s| *s);
        let data_c = match data {
            Some(d) => Some(CString::new(d.as_os_str().as_encoded_bytes()).map_err(|e| e.to_string())?),
            None => None,
        };
        let rate = initialize(
            AUDIO_OUTPUT_SYNCHRONOUS,
            0,
            data_c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
            INITIALIZE_DONT_EXIT,
        );
        let mut data_path: *const c_char = std::ptr::null();
        let version = info(&mut data_path);
        let text = |p: *const c_char| {
            if p.is_null() {
                String::new()
            } else {
                CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        };
        let (version, data_path) = (text(version), text(data_path));
        if rate <= 0 {
            return Err(format!(
                "espeak-ng {version} ({}) failed to initialise with its data at {data_path:?}: install espeak-ng-data \
                 or set the engine parameter `espeak_data`",
                path.display()
            ));
        }
        Espeak {
            set_voice,
            to_phonemes,
            to_phonemes_term,
            voice: None,
            info: EspeakInfo { library: path, version, data_path, terminator_api: to_phonemes_term.is_some() },
            _library: lib,
        }
    };
    let info = espeak.info.clone();
    *guard = Some(espeak);
    Ok(info)
}

fn open(library: Option<&Path>) -> Result<(Library, PathBuf), String> {
    let candidates: Vec<PathBuf> = match library {
        Some(p) => vec![p.to_path_buf()],
        None => LIBRARY_NAMES.iter().map(PathBuf::from).collect(),
    };
    let mut errors = Vec::new();
    for c in &candidates {
        // SAFETY: opening espeak-ng runs no initialisers beyond the C runtime's.
        match unsafe { Library::new(c) } {
            Ok(lib) => return Ok((lib, c.clone())),
            Err(e) => errors.push(e.to_string()),
        }
    }
    Err(format!(
        "cannot open libespeak-ng, which Piper voices need for phonemes ({}): install it (Debian: apt-get install \
         espeak-ng, or run scripts/install-deps) or set the engine parameter `espeak_library`",
        errors.join("; ")
    ))
}

impl Espeak {
    fn select(&mut self, voice: &str) -> Result<(), String> {
        if self.voice.as_deref() == Some(voice) {
            return Ok(());
        }
        let name = CString::new(voice).map_err(|_| format!("espeak voice {voice:?} contains a NUL byte"))?;
        // SAFETY: `name` is a valid C string for the duration of the call.
        let status = unsafe { (self.set_voice)(name.as_ptr()) };
        if status != 0 {
            // espeak-ng may have dropped the old voice while failing.
            self.voice = None;
            return Err(format!("espeak-ng has no voice {voice:?} (error {status})"));
        }
        self.voice = Some(voice.to_string());
        Ok(())
    }

    fn clauses(&mut self, text: &str) -> Result<Vec<Clause>, String> {
        // espeak-ng reads up to a NUL; one inside the text would silently cut it short.
        let c_text = CString::new(text.replace('\0', " ")).expect("NULs were replaced");
        let bytes = c_text.as_bytes();
        let base = c_text.as_ptr() as usize;
        let mut ptr: *const c_void = c_text.as_ptr().cast();
        let mut clauses = Vec::new();
        while !ptr.is_null() {
            let start = (ptr as usize).wrapping_sub(base);
            if start > bytes.len() {
                return Err("espeak-ng moved its text pointer outside the text".into());
            }
            let mut code: c_int = 0;
            // SAFETY: `ptr` points into `c_text`, which is NUL-terminated and outlives the call;
            // espeak-ng advances it within the text or sets it to NULL at the end.
            let out = unsafe {
                match self.to_phonemes_term {
                    Some(f) => f(&mut ptr, CHARS_UTF8, PHONEMES_IPA, &mut code),
                    None => (self.to_phonemes)(&mut ptr, CHARS_UTF8, PHONEMES_IPA),
                }
            };
            let phonemes = if out.is_null() {
                String::new()
            } else {
                // SAFETY: espeak-ng returns a NUL-terminated string it owns until the next call.
                unsafe { CStr::from_ptr(out) }.to_string_lossy().into_owned()
            };
            let end = if ptr.is_null() { bytes.len() } else { (ptr as usize).wrapping_sub(base) };
            if end > bytes.len() || (end <= start && !ptr.is_null()) {
                return Err("espeak-ng stopped advancing through the text".into());
            }
            let (terminator, end_of_sentence) = if self.to_phonemes_term.is_some() {
                clause_end_from_code(code)
            } else {
                clause_end_from_text(&String::from_utf8_lossy(&bytes[start..end]), ptr.is_null())
            };
            clauses.push(Clause { phonemes, terminator, end_of_sentence });
        }
        Ok(clauses)
    }
}

/// Checks that espeak-ng has `voice` (at load time, so a request does not find out).
pub fn check_voice(voice: &str) -> Result<(), String> {
    let mut guard = lock();
    let espeak = guard.as_mut().ok_or("espeak-ng is not initialised")?;
    espeak.select(voice)
}

/// `text` read by espeak-ng's `voice`, clause by clause.
pub fn clauses(voice: &str, text: &str) -> Result<Vec<Clause>, String> {
    let mut guard = lock();
    let espeak = guard.as_mut().ok_or("espeak-ng is not initialised")?;
    espeak.select(voice)?;
    espeak.clauses(text)
}
