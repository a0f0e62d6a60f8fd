//! A position-tracking little-endian reader that checks every length against the bytes left in
//! the file before reading or allocating, so a corrupt count fails fast instead of allocating.

use super::error::{GgufError, Item};
use std::io::{BufReader, ErrorKind, Read, Seek, SeekFrom};

pub(crate) struct Stream<R> {
    inner: BufReader<R>,
    pos: u64,
    len: u64,
    /// How many more array elements may be loaded into memory. Values take ~50 bytes each and
    /// a u8 element one byte of file, so without this bound nested arrays could make a crafted
    /// file's memory use fifty times its size; past it, arrays are kept on disk like long ones.
    pub inline_budget: u64,
}

/// Real files load a few thousand elements (per-layer arrays); this is far above that.
const INLINE_BUDGET: u64 = 1 << 16;

impl<R: Read + Seek> Stream<R> {
    /// Reads from the start of `reader`; its length bounds every later read.
    pub fn new(mut reader: R) -> Result<Self, GgufError> {
        let io = |source| GgufError::Io { offset: 0, source };
        let len = reader.seek(SeekFrom::End(0)).map_err(io)?;
        reader.seek(SeekFrom::Start(0)).map_err(io)?;
        Ok(Self { inner: BufReader::new(reader), pos: 0, len, inline_budget: INLINE_BUDGET })
    }

    pub fn pos(&self) -> u64 {
        self.pos
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn remaining(&self) -> u64 {
        self.len.saturating_sub(self.pos)
    }

    fn ensure(&self, needed: u64, item: &Item) -> Result<(), GgufError> {
        if needed > self.remaining() {
            return Err(GgufError::Truncated { item: item.clone(), offset: self.pos, needed, file_len: self.len });
        }
        Ok(())
    }

    fn io_error(&self, source: std::io::Error, item: &Item, needed: u64) -> GgufError {
        // The file shrank under us: report it like any other truncation.
        if source.kind() == ErrorKind::UnexpectedEof {
            GgufError::Truncated { item: item.clone(), offset: self.pos, needed, file_len: self.pos }
        } else {
            GgufError::Io { offset: self.pos, source }
        }
    }

    pub fn array<const N: usize>(&mut self, item: &Item) -> Result<[u8; N], GgufError> {
        self.ensure(N as u64, item)?;
        let mut buf = [0u8; N];
        self.inner.read_exact(&mut buf).map_err(|e| self.io_error(e, item, N as u64))?;
        self.pos += N as u64;
        Ok(buf)
    }

    pub fn u8(&mut self, item: &Item) -> Result<u8, GgufError> {
        Ok(self.array::<1>(item)?[0])
    }

    pub fn u32(&mut self, item: &Item) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(item)?))
    }

    pub fn u64(&mut self, item: &Item) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(item)?))
    }

    /// Reads `len` bytes; callers bound `len` first, and it cannot exceed the file's size.
    pub fn bytes(&mut self, len: u64, item: &Item) -> Result<Vec<u8>, GgufError> {
        self.ensure(len, item)?;
        let mut buf = vec![0u8; len as usize];
        self.inner.read_exact(&mut buf).map_err(|e| self.io_error(e, item, len))?;
        self.pos += len;
        Ok(buf)
    }

    pub fn skip(&mut self, len: u64, item: &Item) -> Result<(), GgufError> {
        self.ensure(len, item)?;
        // seek_relative keeps BufReader's buffer when the target is inside it: skipping thousands of
        // short token strings then costs no system calls.
        let result = match i64::try_from(len) {
            Ok(n) => self.inner.seek_relative(n),
            Err(_) => self.inner.seek(SeekFrom::Start(self.pos + len)).map(drop),
        };
        result.map_err(|source| GgufError::Io { offset: self.pos, source })?;
        self.pos += len;
        Ok(())
    }

    pub fn seek_to(&mut self, offset: u64) -> Result<(), GgufError> {
        self.inner.seek(SeekFrom::Start(offset)).map_err(|source| GgufError::Io { offset, source })?;
        self.pos = offset;
        Ok(())
    }
}
