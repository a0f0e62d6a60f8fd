//! What a GGUF says about itself (architecture, quantization, chat template), read from the head
//! of the file only: over HTTP with `Range` requests (through the hub client) that grow the
//! prefix while the header parser wants bytes beyond it, or from a local file.

use super::RegisterError;
use llmr_hub::{Hub, Remote};
use llmr_model_store::gguf::{GgufError, GgufHeader};
use std::io::{self, Read, Seek, SeekFrom};
use std::path::PathBuf;

/// How much of a remote GGUF is fetched first, and the most ever fetched. SmolLM2's header is
/// about 2 MB; vocabularies of 250k tokens make headers of ~10 MB.
#[derive(Clone, Copy, Debug)]
pub(super) struct HeadLimits {
    pub initial: u64,
    pub max: u64,
}

pub(super) const HEAD_LIMITS: HeadLimits = HeadLimits { initial: 8 << 20, max: 64 << 20 };

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct GgufFacts {
    pub architecture: Option<String>,
    pub quantization: Option<String>,
    pub has_chat_template: bool,
}

impl GgufFacts {
    fn of(header: &GgufHeader) -> Self {
        Self {
            architecture: header.architecture().map(str::to_string),
            quantization: header.quantization().map(str::to_string),
            has_chat_template: header.chat_template().is_some_and(|t| !t.trim().is_empty()),
        }
    }
}

/// The first bytes of a file of `size` bytes, as a reader of the whole file: reading past the
/// prefix fails and records where, so the caller can fetch more and parse again.
struct Prefix<'a> {
    bytes: &'a [u8],
    size: u64,
    pos: u64,
    wanted: Option<u64>,
}

impl Read for Prefix<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.pos >= self.size {
            return Ok(0);
        }
        let Some(available) = self.bytes.get(self.pos as usize..).filter(|a| !a.is_empty()) else {
            self.wanted = Some(self.pos);
            return Err(io::Error::other("past the fetched head of the file"));
        };
        let n = available.len().min(buf.len());
        buf[..n].copy_from_slice(&available[..n]);
        self.pos += n as u64;
        Ok(n)
    }
}

impl Seek for Prefix<'_> {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let pos = match to {
            SeekFrom::Start(p) => Some(p),
            SeekFrom::End(d) => self.size.checked_add_signed(d),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
        };
        self.pos = pos.ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "seek before the start"))?;
        Ok(self.pos)
    }
}

enum Parsed {
    Done(GgufFacts),
    /// The parser wants the byte at this offset, beyond the prefix.
    NeedMore(u64),
    Failed(GgufError),
}

fn parse_prefix(bytes: &[u8], size: u64) -> Parsed {
    let mut prefix = Prefix { bytes, size, pos: 0, wanted: None };
    match GgufHeader::read_from(&mut prefix) {
        Ok(header) => Parsed::Done(GgufFacts::of(&header)),
        Err(error) => match prefix.wanted {
            Some(offset) => Parsed::NeedMore(offset),
            None => Parsed::Failed(error),
        },
    }
}

fn not_gguf(param: &'static str, what: &str, error: GgufError) -> RegisterError {
    RegisterError::invalid(param, format!("{what} is not a usable GGUF file: {error}"))
}

/// Reads the header of the remote GGUF of `size` bytes from its head.
pub(super) async fn read_remote(
    hub: &Hub,
    remote: &Remote,
    size: u64,
    limits: HeadLimits,
    param: &'static str,
    what: &str,
) -> Result<GgufFacts, RegisterError> {
    let mut head = Vec::new();
    let mut want = limits.initial.min(size);
    loop {
        let have = head.len() as u64;
        if want > have {
            let more = hub.read_range(remote, have..want).await.map_err(|e| RegisterError::hub(param, e))?;
            head.extend_from_slice(&more);
        }
        match parse_prefix(&head, size) {
            Parsed::Done(facts) => return Ok(facts),
            Parsed::Failed(error) => return Err(not_gguf(param, what, error)),
            Parsed::NeedMore(offset) => {
                let have = head.len() as u64;
                if have >= limits.max {
                    let message = format!("{what}: the GGUF header is larger than {} MiB", limits.max >> 20);
                    return Err(RegisterError::invalid(param, message));
                }
                want = (have * 2).max(offset + (1 << 20)).min(limits.max).min(size);
            }
        }
    }
}

/// Reads the header of a local GGUF file (blocking work, off the async threads).
pub(super) async fn read_local(path: PathBuf, param: &'static str, what: String) -> Result<GgufFacts, RegisterError> {
    let task = tokio::task::spawn_blocking(move || {
        GgufHeader::open(&path).map(|h| GgufFacts::of(&h)).map_err(|e| not_gguf(param, &what, e))
    });
    task.await.map_err(|e| RegisterError::internal(format!("reading a GGUF header: {e}")))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_prefix_asks_for_more_and_garbage_fails() {
        match parse_prefix(b"GGUF", 1000) {
            Parsed::NeedMore(offset) => assert_eq!(offset, 4),
            _ => panic!("expected NeedMore"),
        }
        assert!(matches!(parse_prefix(b"PK\x03\x04 not a gguf", 1000), Parsed::Failed(GgufError::NotGguf { .. })));
    }

    /// SmolLM2 from `scripts/fetch-models`, served by a hub mirror.
    async fn smollm2_on_a_hub() -> (llmr_hub_mirror::HubMirror, tempfile::TempDir, u64) {
        let model = llmr_hub_mirror::real_model("smollm2", "smollm2-135m-instruct-q4_1.gguf");
        let dir = tempfile::tempdir().unwrap();
        llmr_hub_mirror::link(&model, &dir.path().join("m.gguf"));
        let hub = llmr_hub_mirror::HubMirror::start(vec![("o/m".into(), dir.path().into())]).await.unwrap();
        let size = std::fs::metadata(&model).unwrap().len();
        (hub, dir, size)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_prefix_grows_until_the_header_fits_and_no_further_than_the_cap() {
        let (hub, _dir, size) = smollm2_on_a_hub().await;
        let client = Hub::new(&hub.endpoint(), None).unwrap();
        let remote = client.file("o/m", "main", "m.gguf");
        let small = HeadLimits { initial: 64 << 10, max: 64 << 20 };
        let facts = read_remote(&client, &remote, size, small, "repo", "m.gguf").await.unwrap();
        assert_eq!(
            facts,
            GgufFacts {
                architecture: Some("llama".into()),
                quantization: Some("Q4_1".into()),
                has_chat_template: true
            }
        );
        let ranges: Vec<String> = hub.request_log().into_iter().filter_map(|r| r.range).collect();
        assert!(ranges.len() > 2, "{ranges:?}");
        assert_eq!(ranges[0], "bytes=0-65535");
        let end: u64 = ranges[1].strip_prefix("bytes=65536-").expect("only the missing bytes").parse().unwrap();
        assert!(end > 1 << 20, "past the wanted byte by 1 MiB: {ranges:?}");

        let capped = HeadLimits { initial: 64 << 10, max: 1 << 20 };
        let e = read_remote(&client, &remote, size, capped, "repo", "m.gguf").await.unwrap_err();
        assert_eq!(e.param(), Some("repo"));
        assert!(e.to_string().contains("larger than 1 MiB"), "{e}");
    }
}
