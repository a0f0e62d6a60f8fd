//! Idle caches kept at int8 in host memory (spec 002's L1 for what no sequence attends over):
//! a sequence's state as `llama_state_seq_get_data` writes it, with every f16 run of keys and
//! values stored as int8 codes and one f16 scale per 32 values (llama.cpp's q8_0 arithmetic),
//! about 53% of the bytes. Restoring writes the same layout back with the values dequantized,
//! which llama.cpp reads as any saved state.
//!
//! The layout is that of the vendored llama.cpp's `llama_context::state_seq_get_data` (a magic
//! number and the sequence id) and `llama_kv_cache::state_write` (one such block per cache: two
//! for a sliding-window model): streams, each with its cell count, per cell its
//! position and sequence ids, then per layer the keys' type, row size and rows, then the values
//! likewise (or, transposed, per channel). Only models whose cells carry nothing else and whose
//! every layer has values are packed (`model::can_shift`'s architectures); a state that does not
//! parse to its last byte stays exact, so a layout change in llama.cpp costs memory, never data.

use half::f16;

/// `GGML_TYPE_F16`.
const GGML_F16: i32 = 1;
/// What a sequence's state starts with (`io_magic` in llama-context.cpp).
const STATE_MAGIC: u32 = 0xaf14_3cd8;
/// Values per scale.
const GROUP: usize = 32;

/// A saved state with its f16 runs at int8.
pub struct PackedState {
    /// The state's bytes outside the f16 runs, in order.
    skeleton: Vec<u8>,
    /// Each f16 run: its offset in the state and its number of values.
    runs: Vec<(usize, usize)>,
    scales: Vec<f16>,
    codes: Vec<i8>,
    len: usize,
}

impl PackedState {
    /// Packs `state`, or `None` when it does not parse as expected or holds no f16 run.
    pub fn pack(state: &[u8]) -> Option<Self> {
        let runs = f16_runs(state)?;
        if runs.is_empty() {
            return None;
        }
        let values: usize = runs.iter().map(|r| r.1).sum();
        let mut packed = PackedState {
            skeleton: Vec::with_capacity(state.len() - 2 * values),
            runs,
            scales: Vec::new(),
            codes: Vec::with_capacity(values),
            len: state.len(),
        };
        let mut at = 0;
        for &(offset, n) in &packed.runs {
            packed.skeleton.extend_from_slice(&state[at..offset]);
            let run = &state[offset..offset + 2 * n];
            for group in run.chunks(2 * GROUP) {
                let x: Vec<f32> = group.chunks_exact(2).map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32()).collect();
                let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
                let scale = f16::from_f32(amax / 127.0);
                let inv = if scale.to_f32() > 0.0 { 1.0 / scale.to_f32() } else { 0.0 };
                packed.scales.push(scale);
                packed.codes.extend(x.iter().map(|v| (v * inv).round().clamp(-127.0, 127.0) as i8));
            }
            at = offset + 2 * n;
        }
        packed.skeleton.extend_from_slice(&state[at..]);
        Some(packed)
    }

    /// The state's layout with every packed value dequantized.
    pub fn unpack(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.len);
        let (mut from, mut at, mut group) = (0, 0, 0);
        let mut codes = self.codes.iter();
        for &(offset, n) in &self.runs {
            let plain = offset - at;
            out.extend_from_slice(&self.skeleton[from..from + plain]);
            from += plain;
            let mut left = n;
            while left > 0 {
                let scale = self.scales[group].to_f32();
                group += 1;
                for &c in codes.by_ref().take(left.min(GROUP)) {
                    out.extend_from_slice(&f16::from_f32(f32::from(c) * scale).to_le_bytes());
                }
                left -= left.min(GROUP);
            }
            at = offset + 2 * n;
        }
        out.extend_from_slice(&self.skeleton[from..]);
        out
    }

    /// Host memory it holds.
    pub fn byte_len(&self) -> usize {
        self.skeleton.len() + 2 * self.scales.len() + self.codes.len() + 16 * self.runs.len()
    }
}

/// Reads little-endian fields of a state in order.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len())?;
        let s = &self.bytes[self.at..end];
        self.at = end;
        Some(s)
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4).map(|b| u32::from_le_bytes(b.try_into().unwrap()))
    }
    fn i32(&mut self) -> Option<i32> {
        self.u32().map(|v| v as i32)
    }
    fn u64(&mut self) -> Option<u64> {
        self.take(8).map(|b| u64::from_le_bytes(b.try_into().unwrap()))
    }
}

/// The f16 runs (offset, values) of a sequence's state made of whole cache blocks, or `None`
/// when it is not exactly that.
fn f16_runs(state: &[u8]) -> Option<Vec<(usize, usize)>> {
    let mut r = Reader { bytes: state, at: 0 };
    let mut runs = Vec::new();
    if r.u32()? != STATE_MAGIC {
        return None;
    }
    let _seq = r.i32()?;
    while r.at < state.len() {
        let n_stream = r.u32()?;
        for _ in 0..n_stream {
            let cells = r.u32()? as usize;
            if cells == 0 {
                continue;
            }
            for _ in 0..cells {
                let _pos = r.i32()?;
                let n_seq = r.u32()? as usize;
                r.take(n_seq.checked_mul(4)?)?;
            }
            let v_trans = r.u32()?;
            let n_layer = r.u32()? as usize;
            let _rot = (r.u32()?, r.u32()?);
            if v_trans > 1 || n_layer == 0 {
                return None;
            }
            let rows = |r: &mut Reader, runs: &mut Vec<(usize, usize)>| -> Option<()> {
                let ty = r.i32()?;
                let row = r.u64()? as usize;
                let len = row.checked_mul(cells)?;
                let offset = r.at;
                r.take(len)?;
                if ty == GGML_F16 && row.is_multiple_of(2) {
                    runs.push((offset, len / 2));
                }
                Some(())
            };
            for _ in 0..n_layer {
                rows(&mut r, &mut runs)?;
            }
            if v_trans == 0 {
                for _ in 0..n_layer {
                    rows(&mut r, &mut runs)?;
                }
            } else {
                for _ in 0..n_layer {
                    let ty = r.i32()?;
                    let el = r.u32()? as usize;
                    let channels = r.u32()? as usize;
                    let len = el.checked_mul(channels)?.checked_mul(cells)?;
                    let offset = r.at;
                    r.take(len)?;
                    if ty == GGML_F16 && el == 2 {
                        runs.push((offset, len / 2));
                    }
                }
            }
        }
    }
    Some(runs)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A state as llama.cpp writes one: a stream of `cells` cells, `layers` layers of `width`
    /// f16 channels, values transposed or not; and its values in order. The `second` cache of a
    /// sliding-window model follows the first without the header.
    fn state(cells: u32, layers: u32, width: usize, v_trans: bool, second: bool) -> (Vec<u8>, Vec<f32>) {
        let mut s = Vec::new();
        let mut values = Vec::new();
        if !second {
            s.extend_from_slice(&STATE_MAGIC.to_le_bytes());
            s.extend_from_slice(&5i32.to_le_bytes());
        }
        let mut f16s = |s: &mut Vec<u8>, n: usize| {
            for _ in 0..n {
                let k = values.len();
                let v = ((k * 37 % 101) as f32 - 50.0) * 0.013 * (1.0 + (k / 64) as f32);
                values.push(f16::from_f32(v).to_f32());
                s.extend_from_slice(&f16::from_f32(v).to_le_bytes());
            }
        };
        s.extend_from_slice(&1u32.to_le_bytes());
        s.extend_from_slice(&cells.to_le_bytes());
        for pos in 0..cells {
            s.extend_from_slice(&(pos as i32).to_le_bytes());
            s.extend_from_slice(&1u32.to_le_bytes());
            s.extend_from_slice(&3i32.to_le_bytes());
        }
        for v in [u32::from(v_trans), layers, 64, 64] {
            s.extend_from_slice(&v.to_le_bytes());
        }
        for _ in 0..layers {
            s.extend_from_slice(&GGML_F16.to_le_bytes());
            s.extend_from_slice(&(2 * width as u64).to_le_bytes());
            f16s(&mut s, width * cells as usize);
        }
        for _ in 0..layers {
            s.extend_from_slice(&GGML_F16.to_le_bytes());
            if v_trans {
                s.extend_from_slice(&2u32.to_le_bytes());
                s.extend_from_slice(&(width as u32).to_le_bytes());
            } else {
                s.extend_from_slice(&(2 * width as u64).to_le_bytes());
            }
            f16s(&mut s, width * cells as usize);
        }
        (s, values)
    }

    fn values_of(bytes: &[u8], runs: &[(usize, usize)]) -> Vec<f32> {
        let mut out = Vec::new();
        for &(o, n) in runs {
            out.extend(bytes[o..o + 2 * n].chunks_exact(2).map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32()));
        }
        out
    }

    #[test]
    fn packing_keeps_the_layout_and_each_value_within_half_a_step() {
        for (cells, width, v_trans) in [(5, 64, false), (3, 48, true), (1, 40, false)] {
            // Two caches one after the other, as a sliding-window model saves them.
            let (mut bytes, mut values) = state(cells, 2, width, v_trans, false);
            let (second, more) = state(cells + 1, 1, width, false, true);
            bytes.extend_from_slice(&second);
            values.extend(more);
            let runs = f16_runs(&bytes).unwrap();
            assert_eq!(runs.len(), 6);
            assert_eq!(values_of(&bytes, &runs), values);
            let packed = PackedState::pack(&bytes).unwrap();
            // A byte per value instead of two, and two per group of 32 for its scale.
            let groups: usize = runs.iter().map(|r| r.1.div_ceil(GROUP)).sum();
            assert_eq!(packed.byte_len(), bytes.len() - values.len() + 2 * groups + 16 * runs.len());
            let back = packed.unpack();
            assert_eq!(back.len(), bytes.len());
            // Everything but the values comes back byte for byte.
            let mut mask = vec![true; bytes.len()];
            for &(o, n) in &runs {
                mask[o..o + 2 * n].iter_mut().for_each(|m| *m = false);
            }
            let kept = |b: &[u8]| b.iter().zip(&mask).filter(|(_, &m)| m).map(|(x, _)| *x).collect::<Vec<_>>();
            assert_eq!(kept(&back), kept(&bytes));
            // Each value within half a step of its group's scale (plus f16 rounding).
            let got = values_of(&back, &runs);
            let mut at = 0;
            for &(_, n) in &runs {
                for g in (0..n).step_by(GROUP) {
                    let group = &values[at + g..at + (g + GROUP).min(n)];
                    let step = group.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
                    for (i, v) in group.iter().enumerate() {
                        let err = (got[at + g + i] - v).abs();
                        assert!(err <= step * 0.51 + v.abs() * 2e-3 + 1e-6, "{v} came back {}", got[at + g + i]);
                    }
                }
                at += n;
            }
        }
    }

    #[test]
    fn a_state_that_does_not_parse_to_its_end_stays_exact() {
        let (bytes, _) = state(4, 2, 64, false, false);
        assert!(PackedState::pack(&bytes[..bytes.len() - 1]).is_none(), "truncated");
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(PackedState::pack(&longer).is_none(), "a byte too many");
        // A q8_0 cache has no f16 run to pack.
        let mut q8 = bytes.clone();
        let first_type = 8 + 4 + 4 + 4 * 12 + 16;
        q8[first_type..first_type + 4].copy_from_slice(&8i32.to_le_bytes());
        assert_eq!(f16_runs(&q8).unwrap().len(), 3);
        assert!(PackedState::pack(&[]).is_none());
        let mut foreign = bytes.clone();
        foreign[0] ^= 1;
        assert!(PackedState::pack(&foreign).is_none(), "another magic number");
    }
}
