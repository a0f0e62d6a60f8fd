//! A loaded plugin: the shared library, its resolved exports and its identity.
//!
//! The library is opened with libloading and every ABI 1.0 export is resolved up front, so a
//! plugin missing one is refused at load time rather than failing on first use. `get_info` is the
//! first call made and the ABI major version is checked before any other.

use crate::manifest::{Manifest, ManifestError};
use llmr_engine_abi as abi;
use std::ffi::CStr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The resolved exports. Plain function pointers: valid as long as `Plugin::_library` lives,
/// which every holder guarantees by keeping an `Arc<Plugin>`.
pub(crate) struct Exports {
    pub create: abi::llmr_engine_create_fn,
    pub destroy: abi::llmr_engine_destroy_fn,
    pub load_model: abi::llmr_engine_load_model_fn,
    pub unload_model: abi::llmr_engine_unload_model_fn,
    pub model_info: abi::llmr_engine_model_info_fn,
    pub tokenize: abi::llmr_engine_tokenize_fn,
    pub infer: abi::llmr_engine_infer_fn,
    pub embed: abi::llmr_engine_embed_fn,
    pub transcribe: abi::llmr_engine_transcribe_fn,
    pub synthesize: abi::llmr_engine_synthesize_fn,
    pub generate_image: abi::llmr_engine_generate_image_fn,
    pub cancel: abi::llmr_engine_cancel_fn,
    pub get_metrics: abi::llmr_engine_get_metrics_fn,
    pub set_config: abi::llmr_engine_set_config_fn,
    pub last_error: abi::llmr_engine_last_error_fn,
}

/// What `llmr_engine_get_info` reported, copied out of the plugin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PluginInfo {
    pub engine_id: String,
    pub version: String,
    pub abi_major: u32,
    pub abi_minor: u32,
    pub capabilities: u32,
}

pub struct Plugin {
    pub manifest: Manifest,
    pub dir: PathBuf,
    pub info: PluginInfo,
    pub(crate) exports: Exports,
    // Declared last: dropped after everything above (the library outlives its pointers).
    _library: libloading::Library,
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin").field("id", &self.manifest.id).field("dir", &self.dir).finish()
    }
}

impl Plugin {
    /// Opens `dir/<manifest.binary>`, resolves the exports and checks `get_info` against the
    /// host's ABI and the manifest.
    pub fn open(dir: &Path, manifest: Manifest) -> Result<Arc<Plugin>, ManifestError> {
        let path = dir.join(&manifest.binary);
        Self::open_file(dir, manifest, &path, &path)
    }

    /// [`Plugin::open`] for a new version of a plugin this process has open already (hot
    /// reload): the dynamic loader hands back the library it has for a path it has loaded,
    /// whatever the file there is now, so the new file is opened through a hard link of its own
    /// in the same folder, removed once open. A folder that takes no link (read-only) is an error.
    pub fn open_again(dir: &Path, manifest: Manifest) -> Result<Arc<Plugin>, ManifestError> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let path = dir.join(&manifest.binary);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let link = dir.join(format!(".{}.reload-{}-{n}", manifest.binary, std::process::id()));
        std::fs::hard_link(&path, &link).map_err(|e| ManifestError::Invalid {
            path: path.clone(),
            reason: format!("cannot open a new version beside the loaded one (a link in the folder: {e})"),
        })?;
        let opened = Self::open_file(dir, manifest, &link, &path);
        let _ = std::fs::remove_file(&link);
        opened
    }

    /// Opens the library at `file` (`path` in messages).
    fn open_file(dir: &Path, manifest: Manifest, file: &Path, path: &Path) -> Result<Arc<Plugin>, ManifestError> {
        let invalid = |reason: String| ManifestError::Invalid { path: path.to_path_buf(), reason };
        // SAFETY: loading a library runs its initialisers; plugins are trusted code by design
        // (spec: in-process engines), and the folder was validated first.
        let library = unsafe { libloading::Library::new(file) }.map_err(|e| invalid(format!("cannot load: {e}")))?;

        macro_rules! sym {
            ($name:expr, $ty:ty) => {{
                // SAFETY: the symbol is declared with this type in llmr_engine.h.
                let s: libloading::Symbol<$ty> = unsafe { library.get($name) }.map_err(|_| {
                    invalid(format!("missing export `{}`", String::from_utf8_lossy(&$name[..$name.len() - 1])))
                })?;
                *s
            }};
        }

        let get_info = sym!(abi::symbols::GET_INFO, abi::llmr_engine_get_info_fn);
        // SAFETY: get_info takes no arguments and returns static data (or NULL from a bad plugin).
        let info_ptr = unsafe { get_info() };
        let info = unsafe { read_info(info_ptr) }.map_err(invalid)?;
        if info.abi_major != abi::LLMR_ENGINE_ABI_MAJOR {
            return Err(ManifestError::AbiMismatch {
                expected: abi::LLMR_ENGINE_ABI_MAJOR,
                got: info.abi_major.to_string(),
            });
        }
        if info.engine_id != manifest.id {
            return Err(ManifestError::IdMismatch(format!(
                "manifest says {:?}, the binary reports {:?}",
                manifest.id, info.engine_id
            )));
        }
        if info.version != manifest.version.to_string() {
            return Err(invalid(format!(
                "manifest version {} differs from the binary's {}",
                manifest.version, info.version
            )));
        }

        let exports = Exports {
            create: sym!(abi::symbols::CREATE, abi::llmr_engine_create_fn),
            destroy: sym!(abi::symbols::DESTROY, abi::llmr_engine_destroy_fn),
            load_model: sym!(abi::symbols::LOAD_MODEL, abi::llmr_engine_load_model_fn),
            unload_model: sym!(abi::symbols::UNLOAD_MODEL, abi::llmr_engine_unload_model_fn),
            model_info: sym!(abi::symbols::MODEL_INFO, abi::llmr_engine_model_info_fn),
            tokenize: sym!(abi::symbols::TOKENIZE, abi::llmr_engine_tokenize_fn),
            infer: sym!(abi::symbols::INFER, abi::llmr_engine_infer_fn),
            embed: sym!(abi::symbols::EMBED, abi::llmr_engine_embed_fn),
            transcribe: sym!(abi::symbols::TRANSCRIBE, abi::llmr_engine_transcribe_fn),
            synthesize: sym!(abi::symbols::SYNTHESIZE, abi::llmr_engine_synthesize_fn),
            generate_image: sym!(abi::symbols::GENERATE_IMAGE, abi::llmr_engine_generate_image_fn),
            cancel: sym!(abi::symbols::CANCEL, abi::llmr_engine_cancel_fn),
            get_metrics: sym!(abi::symbols::GET_METRICS, abi::llmr_engine_get_metrics_fn),
            set_config: sym!(abi::symbols::SET_CONFIG, abi::llmr_engine_set_config_fn),
            last_error: sym!(abi::symbols::LAST_ERROR, abi::llmr_engine_last_error_fn),
        };
        Ok(Arc::new(Plugin { manifest, dir: dir.to_path_buf(), info, exports, _library: library }))
    }

    pub fn id(&self) -> &str {
        &self.manifest.id
    }
}

/// Copies the plugin's info block, applying the struct-size rule and refusing NULLs.
unsafe fn read_info(ptr: *const abi::llmr_engine_info) -> Result<PluginInfo, String> {
    let info = ptr.as_ref().ok_or("llmr_engine_get_info returned NULL")?;
    // abi_major sits right after struct_size in every version; read it first so that a plugin of
    // another major version gets the ABI message rather than a size complaint.
    if (info.struct_size as usize) < 8 {
        return Err(format!("llmr_engine_info.struct_size is {}", info.struct_size));
    }
    if info.abi_major != abi::LLMR_ENGINE_ABI_MAJOR {
        return Ok(PluginInfo {
            engine_id: String::new(),
            version: String::new(),
            abi_major: info.abi_major,
            abi_minor: 0,
            capabilities: 0,
        });
    }
    if (info.struct_size as usize) < std::mem::size_of::<abi::llmr_engine_info>() {
        return Err(format!(
            "llmr_engine_info.struct_size is {}, ABI 1.0 needs {}",
            info.struct_size,
            std::mem::size_of::<abi::llmr_engine_info>()
        ));
    }
    let text = |p: *const std::ffi::c_char, name: &str| -> Result<String, String> {
        if p.is_null() {
            return Err(format!("llmr_engine_info.{name} is NULL"));
        }
        CStr::from_ptr(p).to_str().map(str::to_owned).map_err(|_| format!("llmr_engine_info.{name} is not UTF-8"))
    };
    Ok(PluginInfo {
        engine_id: text(info.engine_id, "engine_id")?,
        version: text(info.version, "version")?,
        abi_major: info.abi_major,
        abi_minor: info.abi_minor,
        capabilities: info.capabilities,
    })
}
