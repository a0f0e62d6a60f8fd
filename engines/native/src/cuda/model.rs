//! The dense decoders (`llama`, `qwen2`, `gemma3_text`) on one GPU: weights as stored (bf16,
//! f16 or f32) in device memory, q/k/v and gate/up fused into one matrix each, the KV cache's
//! blocks in device memory indexed by the host pool's block ids (the host keeps the tables,
//! sharing and prefix index; only the storage moves). The step's math is the CPU
//! architectures' (`arch/llama.rs`, `arch/gemma3.rs`); activations are f32 except the inputs of
//! matrix products, which take the weights' type as cuBLAS needs (as llama.cpp's CUDA backend
//! and transformers in bf16 do).

use super::device::{cuda, Arg, DevBuf, Elem, Gpu, GpuError, Graph, Matrix};
use crate::arch::{BatchToken, Output, Picked};
use crate::checkpoint::{Checkpoint, CheckpointError, DType};
use crate::config::{Activation, Arch, LayerAttention, ModelConfig};
use crate::kv_cache::{BlockTable, Shape, BLOCK_TOKENS};
use crate::rope::{Rope, RopeScaling};
use llmr_engine_sdk::Logger;
use llmr_sampling::DevicePick;
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error("{0}")]
    Unsupported(String),
}

fn elem(d: DType) -> Elem {
    match d {
        DType::F32 => Elem::F32,
        DType::BF16 => Elem::Bf16,
        DType::F16 => Elem::F16,
    }
}

/// Weights (several checkpoint matrices stacked by rows) and an f32 bias.
struct DevLinear {
    w: Matrix,
    bias: Option<DevBuf>,
}

/// Uploads the matrices `{name}.weight` of `parts` (name, rows) stacked in that order, with their
/// `{name}.bias` when `bias`.
fn linear(
    gpu: &Gpu,
    ck: &Checkpoint,
    parts: &[(&str, usize)],
    cols: usize,
    bias: bool,
) -> Result<DevLinear, LoadError> {
    let tensors = parts
        .iter()
        .map(|&(name, rows)| ck.get(&format!("{name}.weight"), &[rows, cols]))
        .collect::<Result<Vec<_>, _>>()?;
    let dtype = tensors[0].dtype;
    if let Some((&(name, _), t)) = parts.iter().zip(&tensors).find(|(_, t)| t.dtype != dtype) {
        let why = format!("{name}.weight is {:?}, unlike the {dtype:?} matrices it is fused with", t.dtype);
        return Err(LoadError::Unsupported(why));
    }
    // One matrix goes straight from the mapping (no host copy of an embedding table).
    let buf = match &tensors[..] {
        [one] => gpu.upload(one.bytes())?,
        many => gpu.upload(&many.iter().flat_map(|t| t.bytes().iter().copied()).collect::<Vec<u8>>())?,
    };
    let rows = parts.iter().map(|p| p.1).sum();
    let bias = if bias {
        let mut all = Vec::with_capacity(rows);
        for &(name, rows) in parts {
            all.extend(ck.get(&format!("{name}.bias"), &[rows])?.to_f32());
        }
        Some(gpu.upload(&all)?)
    } else {
        None
    };
    Ok(DevLinear { w: Matrix { buf, elem: elem(dtype), rows, cols }, bias })
}

fn vector(gpu: &Gpu, ck: &Checkpoint, name: &str, len: usize) -> Result<DevBuf, LoadError> {
    Ok(gpu.upload(&ck.get(name, &[len])?.to_f32())?)
}

struct Layer {
    input_norm: DevBuf,
    qkv: DevLinear,
    /// Gemma's per-head q/k norms.
    qk_norms: Option<(DevBuf, DevBuf)>,
    o: DevLinear,
    /// Gemma's norm of the attention output before the residual add.
    attn_out_norm: Option<DevBuf>,
    mlp_norm: DevBuf,
    gate_up: DevLinear,
    down: DevLinear,
    /// Gemma's norm of the MLP output before the residual add.
    mlp_out_norm: Option<DevBuf>,
    sliding: bool,
}

/// Device buffers of one step, grown to the largest step seen.
struct StepBuffers {
    tokens: usize,
    /// Rows `out` holds (the most tokens a step has wanted output for).
    out_rows: usize,
    ids: DevBuf,
    pos: DevBuf,
    seq: DevBuf,
    rows: DevBuf,
    tables: DevBuf,
    x: DevBuf,
    qkv: DevBuf,
    o: DevBuf,
    gu: DevBuf,
    /// The input of the next matrix product, in its weights' type.
    cast: DevBuf,
    last: DevBuf,
    out: DevBuf,
    /// What the pick kernels do with each output row ([`PICK_FLOATS`] f32 each), what their
    /// passes leave for the next ([`PICK_SCRATCH_BYTES`] a row), and the ids they picked, when
    /// the step picks them on the device.
    picks: DevBuf,
    pick_scratch: DevBuf,
    picked: DevBuf,
}

pub struct CudaModel {
    gpu: Gpu,
    config: ModelConfig,
    embed: DevLinear,
    lm_head: Option<DevLinear>,
    norm: DevBuf,
    layers: Vec<Layer>,
    /// Gemma: 1 (weights stored zero-centred); llama: 0.
    norm_offset: f32,
    embed_scale: f32,
    /// Inverse frequencies and cos/sin factor of full layers, and of sliding ones.
    rope_global: (DevBuf, f32),
    rope_local: (DevBuf, f32),
    cache: DevBuf,
    cache_blocks: usize,
    step: Mutex<Option<StepBuffers>>,
    /// Captured steps by shape (their kernels' arguments point into `step`'s buffers).
    graphs: Mutex<HashMap<StepShape, Graph>>,
    graphs_off: AtomicBool,
    logger: Option<Logger>,
}

impl Drop for CudaModel {
    fn drop(&mut self) {
        // The last reference may go on any thread (the scheduler's, at unload): make the
        // context current for everything released below, graphs before the buffers they use.
        let _ = self.gpu.ctx.bind_to_thread();
        self.graphs.get_mut().unwrap().clear();
        *self.step.get_mut().unwrap() = None;
    }
}

/// What a captured step depends on besides the contents of its input buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct StepShape {
    tokens: usize,
    /// Entries per block table.
    stride: usize,
    /// Tokens whose output is wanted.
    rows: usize,
    want: Want,
}

/// What a step leaves for the host to read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Want {
    Logits,
    /// Final hidden states (embeddings).
    Hidden,
    /// The ids the pick kernels pick (the most likely, or a temperature draw), and the logits of
    /// the rows they leave to the host: the host reads 4 bytes a picked row, not the
    /// vocabulary's logits (1 MiB a row for Gemma 3's 262,144 ids).
    Pick,
}

/// Decoding steps of at most this many sequences are captured as graphs; larger ones spend
/// their time in the products, not in launches.
const GRAPH_MAX_TOKENS: usize = 64;
/// Graphs kept (each shape: sequences x padded table width); the cache starts over when full.
const GRAPH_CACHE: usize = 256;

impl CudaModel {
    /// `c`'s weights from `ck` onto GPU `device`, with a KV cache of `blocks` blocks.
    pub fn load(
        c: &ModelConfig,
        ck: &Checkpoint,
        device: usize,
        (shape, blocks): (Shape, usize),
        logger: Option<Logger>,
    ) -> Result<Self, LoadError> {
        if c.arch == Arch::GptOss {
            return Err(LoadError::Unsupported(
                "gpt_oss runs on the CPU only for now (no MXFP4 GPU kernels yet)".into(),
            ));
        }
        if c.head_dim > 256 || !c.head_dim.is_multiple_of(2) {
            return Err(LoadError::Unsupported(format!(
                "head_dim {} (the GPU kernels take even sizes up to 256)",
                c.head_dim
            )));
        }
        let gpu = Gpu::open(device)?;
        let gemma = c.arch == Arch::Gemma3;
        let (d, hd, inter) = (c.hidden, c.head_dim, c.intermediate);
        let (q, kv) = (c.heads * hd, c.kv_heads * hd);
        // The KV cache first: it is sized by the caller, and its failure is the clearest.
        let cache_bytes = blocks * shape.block_bytes();
        let cache = gpu.alloc(cache_bytes).map_err(|e| match e {
            GpuError::OutOfMemory(_) => GpuError::OutOfMemory(format!(
                "the KV cache ({blocks} blocks, {} MiB) does not fit on {}",
                cache_bytes >> 20,
                gpu.name
            )),
            e => e,
        })?;
        let mut layers = Vec::with_capacity(c.layers);
        for i in 0..c.layers {
            let p = format!("model.layers.{i}");
            let a = format!("{p}.self_attn");
            let (qn, kn, vn) = (format!("{a}.q_proj"), format!("{a}.k_proj"), format!("{a}.v_proj"));
            let (gn, un) = (format!("{p}.mlp.gate_proj"), format!("{p}.mlp.up_proj"));
            let norm = |n: &str, len: usize| vector(&gpu, ck, &format!("{p}.{n}.weight"), len);
            layers.push(Layer {
                input_norm: norm("input_layernorm", d)?,
                qkv: linear(&gpu, ck, &[(&qn, q), (&kn, kv), (&vn, kv)], d, c.qkv_bias)?,
                qk_norms: if gemma {
                    Some((norm("self_attn.q_norm", hd)?, norm("self_attn.k_norm", hd)?))
                } else {
                    None
                },
                o: linear(&gpu, ck, &[(&format!("{a}.o_proj"), d)], q, c.o_bias)?,
                attn_out_norm: if gemma { Some(norm("post_attention_layernorm", d)?) } else { None },
                mlp_norm: norm(if gemma { "pre_feedforward_layernorm" } else { "post_attention_layernorm" }, d)?,
                gate_up: linear(&gpu, ck, &[(&gn, inter), (&un, inter)], d, c.mlp_bias)?,
                down: linear(&gpu, ck, &[(&format!("{p}.mlp.down_proj"), d)], inter, c.mlp_bias)?,
                mlp_out_norm: if gemma { Some(norm("post_feedforward_layernorm", d)?) } else { None },
                sliding: c.layer_attention[i] == LayerAttention::Sliding,
            });
        }
        let embed = linear(&gpu, ck, &[("model.embed_tokens", c.vocab)], d, false)?;
        let lm_head = if c.tie_embeddings { None } else { Some(linear(&gpu, ck, &[("lm_head", c.vocab)], d, false)?) };
        let embed_scale = if gemma {
            crate::arch::gemma3::embed_scale(d, ck.get("model.embed_tokens.weight", &[c.vocab, d])?.dtype)
        } else {
            1.0
        };
        let rope =
            |r: Rope| -> Result<(DevBuf, f32), GpuError> { Ok((gpu.upload(r.inv_freq())?, r.attention_factor())) };
        let rope_global = rope(Rope::new(hd, c.rope_theta, &c.rope_scaling))?;
        let rope_local = rope(Rope::new(hd, c.rope_local_theta, &RopeScaling::None))?;
        Ok(CudaModel {
            norm: vector(&gpu, ck, "model.norm.weight", d)?,
            embed,
            lm_head,
            layers,
            norm_offset: if gemma { 1.0 } else { 0.0 },
            embed_scale,
            rope_global,
            rope_local,
            cache,
            cache_blocks: blocks,
            step: Mutex::new(None),
            graphs: Mutex::default(),
            graphs_off: AtomicBool::new(false),
            logger,
            config: c.clone(),
            gpu,
        })
    }

    /// Decoding steps captured as graphs and kept (0 when capture is off).
    pub fn captured_steps(&self) -> usize {
        self.graphs.lock().unwrap().len()
    }

    /// The device's name, for the load log.
    pub fn device_name(&self) -> &str {
        &self.gpu.name
    }

    /// Makes `slot` hold buffers for `n` tokens, `m` output rows and `table_ints` block-table
    /// entries; true when it had to allocate new ones.
    fn buffers(&self, slot: &mut Option<StepBuffers>, n: usize, m: usize, table_ints: usize) -> Result<bool, GpuError> {
        let c = &self.config;
        if slot.as_ref().is_some_and(|b| b.tokens >= n && b.out_rows >= m && b.tables.bytes >= table_ints * 4) {
            return Ok(false);
        }
        let tokens = n.next_power_of_two().max(16).max(slot.as_ref().map_or(0, |b| b.tokens));
        // Logits are wanted for few rows of a long prompt: `out` is sized by rows, not tokens.
        let out_rows = m.next_power_of_two().max(16).max(slot.as_ref().map_or(0, |b| b.out_rows));
        let tables = table_ints.next_power_of_two().max(slot.as_ref().map_or(0, |b| b.tables.bytes / 4)).max(64);
        *slot = None; // free the old buffers first
        let g = &self.gpu;
        let qkv = (c.heads + 2 * c.kv_heads) * c.head_dim;
        let widest = c.hidden.max(c.heads * c.head_dim).max(c.intermediate);
        let f32s = |count: usize| g.alloc(count * 4);
        *slot = Some(StepBuffers {
            tokens,
            out_rows,
            ids: f32s(tokens)?,
            pos: f32s(tokens)?,
            seq: f32s(tokens)?,
            rows: f32s(tokens)?,
            tables: f32s(tables)?,
            x: f32s(tokens * c.hidden)?,
            qkv: f32s(tokens * qkv)?,
            o: f32s(tokens * c.hidden)?,
            gu: f32s(tokens * 2 * c.intermediate)?,
            cast: f32s(tokens * widest)?,
            last: f32s(tokens * c.hidden)?,
            out: f32s(out_rows * c.vocab.max(c.hidden))?,
            picks: f32s(out_rows * PICK_FLOATS)?,
            pick_scratch: g.alloc(out_rows * PICK_SCRATCH_BYTES)?,
            picked: f32s(out_rows)?,
        });
        Ok(true)
    }

    /// `y = x · wᵀ (+ bias)` for `n` rows of `x` (in `w`'s type) into f32 `y`.
    fn matmul(&self, w: &DevLinear, x: u64, n: usize, y: u64) -> Result<(), GpuError> {
        self.gpu.matmul(&w.w, x, n, y)?;
        if let Some(b) = &w.bias {
            let total = n * w.w.rows;
            self.gpu.launch_flat(
                &self.gpu.k.add_bias,
                total,
                &[Arg::Ptr(y), Arg::Ptr(b.ptr), Arg::I32(w.w.rows as i32), Arg::U64(total as u64)],
            )?;
        }
        Ok(())
    }

    /// RMS norm of `rows` rows of `d` at `x` (after `x += residual` when `residual` is not
    /// null), into any of: `add_to += y`, `out = y`, `cast = y` in `dt`.
    #[allow(clippy::too_many_arguments)]
    fn norm(
        &self,
        (x, residual): (u64, u64),
        w: &DevBuf,
        rows: usize,
        d: usize,
        add_to: u64,
        out: u64,
        cast: u64,
        dt: Elem,
    ) -> Result<(), GpuError> {
        let c = &self.config;
        let threads = (d.next_multiple_of(32) as u32).min(256);
        self.gpu.launch(
            &self.gpu.k.rms_norm,
            (rows as u32, 1),
            threads,
            &[
                Arg::Ptr(x),
                Arg::Ptr(residual),
                Arg::Ptr(w.ptr),
                Arg::F32(self.norm_offset),
                Arg::F32(c.rms_eps),
                Arg::I32(d as i32),
                Arg::Ptr(add_to),
                Arg::Ptr(out),
                Arg::Ptr(cast),
                Arg::I32(dt as i32),
            ],
        )
    }

    /// Runs `batch` as [`crate::arch::Model::forward`] does, its keys and values stored in the
    /// device blocks that `tables` name.
    pub fn forward(&self, tables: &[&BlockTable], batch: &[BatchToken], output: Output) -> Result<Vec<f32>, GpuError> {
        let want = if output == Output::Hidden { Want::Hidden } else { Want::Logits };
        self.step(tables, batch, (want, &[]), |b, shape| {
            let width = if shape.want == Want::Hidden { self.config.hidden } else { self.config.vocab };
            let mut host = vec![0f32; shape.rows * width];
            if !host.is_empty() {
                self.gpu.read(&b.out, &mut host)?;
            }
            Ok(host)
        })
    }

    /// Whether the pick kernels can draw from this model's rows (its block sums fit the
    /// vocabulary).
    pub fn draws(&self) -> bool {
        self.config.vocab <= DRAW_MAX_VOCAB
    }

    /// As [`CudaModel::forward`] with logits, but each output row's id is picked on the device
    /// as `picks` (one per row) says; a row without a pick comes back as its logits.
    pub fn pick(
        &self,
        tables: &[&BlockTable],
        batch: &[BatchToken],
        picks: &[Option<DevicePick>],
    ) -> Result<Vec<Picked>, GpuError> {
        let vocab = self.config.vocab;
        assert_eq!(batch.iter().filter(|t| t.logits).count(), picks.len(), "one pick per output row");
        let mut spec = Vec::with_capacity(picks.len() * PICK_FLOATS);
        for p in picks {
            spec.extend_from_slice(&match p {
                Some(DevicePick::Argmax) => [PICK_ARGMAX, 0.0, 0.0, 0.0, 0.0],
                Some(DevicePick::Draw(d)) => {
                    assert!(self.draws(), "a draw over {vocab} ids");
                    [PICK_DRAW, d.u, d.inv_temperature, d.min_logit_gap, d.top_p]
                }
                None => [PICK_NONE, 0.0, 0.0, 0.0, 0.0],
            });
        }
        self.step(tables, batch, (Want::Pick, &spec), |b, shape| {
            let mut ids = vec![0i32; shape.rows];
            if !ids.is_empty() {
                self.gpu.read(&b.picked, &mut ids)?;
            }
            let mut out = Vec::with_capacity(ids.len());
            for (row, id) in ids.into_iter().enumerate() {
                out.push(if picks[row].is_some() {
                    Picked::Id(id as u32)
                } else {
                    let mut logits = vec![0f32; vocab];
                    self.gpu.read_at(&b.out, row * vocab, &mut logits)?;
                    Picked::Logits(logits)
                });
            }
            Ok(out)
        })
    }

    /// Runs one step and hands its buffers to `read` once the stream has run it. Small steps
    /// (decoding) are captured once per shape as a CUDA graph and replayed: one launch for the
    /// whole step instead of ~10 a layer.
    fn step<T: Default>(
        &self,
        tables: &[&BlockTable],
        batch: &[BatchToken],
        (want, picks): (Want, &[f32]),
        read: impl FnOnce(&StepBuffers, &StepShape) -> Result<T, GpuError>,
    ) -> Result<T, GpuError> {
        let g = &self.gpu;
        g.ctx.bind_to_thread().map_err(cuda)?;
        let n = batch.len();
        if n == 0 {
            return Ok(T::default());
        }
        let rows: Vec<i32> = (0..n).filter(|&t| batch[t].logits).map(|t| t as i32).collect();
        // Block tables padded to a power of two, so that a decoding sequence's graph serves
        // many steps rather than 16.
        let stride = tables.iter().map(|t| t.blocks.len()).max().unwrap_or(0).max(1).next_power_of_two();
        let mut flat = vec![0i32; tables.len() * stride];
        for (s, t) in tables.iter().enumerate() {
            for (j, &b) in t.blocks.iter().enumerate() {
                assert!((b as usize) < self.cache_blocks, "block {b} is outside the device cache");
                flat[s * stride + j] = b as i32;
            }
        }
        let mut slot = self.step.lock().unwrap();
        if self.buffers(&mut slot, n, rows.len(), flat.len())? {
            self.graphs.lock().unwrap().clear(); // they point into the old buffers
        }
        let b = slot.as_ref().expect("sized above");
        let ids: Vec<i32> = batch.iter().map(|t| t.token as i32).collect();
        let pos: Vec<i32> = batch.iter().map(|t| t.pos as i32).collect();
        let seq: Vec<i32> = batch.iter().map(|t| t.seq as i32).collect();
        for (buf, v) in [(&b.ids, &ids), (&b.pos, &pos), (&b.seq, &seq), (&b.rows, &rows), (&b.tables, &flat)] {
            g.write(buf, v)?;
        }
        g.write(&b.picks, picks)?;
        let m = rows.len();
        let shape = StepShape { tokens: n, stride, rows: m, want };
        // Decoding steps (every token wants its logits) repeat their shape step after step;
        // prompt chunks rarely do, and run kernel by kernel.
        if m == n && n <= GRAPH_MAX_TOKENS && !self.graphs_off.load(Ordering::Relaxed) {
            let mut graphs = self.graphs.lock().unwrap();
            if graphs.len() >= GRAPH_CACHE && !graphs.contains_key(&shape) {
                graphs.clear();
            }
            if let Entry::Vacant(slot) = graphs.entry(shape) {
                match g.capture(|| self.enqueue(b, &shape)) {
                    Ok(graph) => {
                        slot.insert(graph);
                    }
                    Err(e) => {
                        // Run eagerly from now on (a driver or library that cannot capture).
                        self.graphs_off.store(true, Ordering::Relaxed);
                        if let Some(log) = &self.logger {
                            log.warn(&format!("CUDA graphs off ({e}): steps run kernel by kernel"));
                        }
                    }
                }
            }
            if let Some(graph) = graphs.get(&shape) {
                graph.launch()?;
                return read(b, &shape);
            }
        }
        self.enqueue(b, &shape)?;
        read(b, &shape)
    }

    /// Puts one step on the stream: every kernel and product from the embedding lookup to the
    /// output rows in `b.out`. The step's inputs are already in `b`; nothing here touches the
    /// host, so the same calls can be captured as a graph.
    fn enqueue(&self, b: &StepBuffers, shape: &StepShape) -> Result<(), GpuError> {
        let c = &self.config;
        let g = &self.gpu;
        let (n, stride) = (shape.tokens, shape.stride);
        let (d, hd, inter) = (c.hidden, c.head_dim, c.intermediate);
        let k = &g.k;
        g.launch(
            &k.embed,
            (n as u32, 1),
            256,
            &[
                Arg::Ptr(self.embed.w.buf.ptr),
                Arg::I32(self.embed.w.elem as i32),
                Arg::Ptr(b.ids.ptr),
                Arg::Ptr(b.x.ptr),
                Arg::I32(d as i32),
                Arg::F32(self.embed_scale),
            ],
        )?;
        let gelu = matches!(c.activation, Activation::GeluTanh) as i32;
        // Whether `b.o` holds a branch output not yet added to `x`: llama's residual adds are
        // fused into the norm that follows them.
        let mut pending = false;
        let input = |pending: bool| (b.x.ptr, if pending { b.o.ptr } else { 0 });
        for (li, l) in self.layers.iter().enumerate() {
            // Attention.
            self.norm(input(pending), &l.input_norm, n, d, 0, 0, b.cast.ptr, l.qkv.w.elem)?;
            self.matmul(&l.qkv, b.cast.ptr, n, b.qkv.ptr)?;
            let (inv_freq, factor) = if l.sliding { &self.rope_local } else { &self.rope_global };
            let (qn, kn) = l.qk_norms.as_ref().map_or((0, 0), |(q, k)| (q.ptr, k.ptr));
            g.launch(
                &k.rope_store,
                (n as u32, 1),
                128,
                &[
                    Arg::Ptr(b.qkv.ptr),
                    Arg::Ptr(b.pos.ptr),
                    Arg::Ptr(b.seq.ptr),
                    Arg::Ptr(b.tables.ptr),
                    Arg::I32(stride as i32),
                    Arg::Ptr(inv_freq.ptr),
                    Arg::F32(*factor),
                    Arg::Ptr(qn),
                    Arg::Ptr(kn),
                    Arg::F32(self.norm_offset),
                    Arg::F32(c.rms_eps),
                    Arg::I32(c.heads as i32),
                    Arg::I32(c.kv_heads as i32),
                    Arg::I32(hd as i32),
                    Arg::Ptr(self.cache.ptr),
                    Arg::I32(c.layers as i32),
                    Arg::I32(li as i32),
                ],
            )?;
            let window = if l.sliding { c.sliding_window as i32 } else { 0 };
            g.launch(
                &k.attention,
                (n as u32, c.heads as u32),
                ATTENTION_THREADS,
                &[
                    Arg::Ptr(b.qkv.ptr),
                    Arg::Ptr(b.pos.ptr),
                    Arg::Ptr(b.seq.ptr),
                    Arg::Ptr(b.tables.ptr),
                    Arg::I32(stride as i32),
                    Arg::Ptr(self.cache.ptr),
                    Arg::I32(c.layers as i32),
                    Arg::I32(li as i32),
                    Arg::I32(c.heads as i32),
                    Arg::I32(c.kv_heads as i32),
                    Arg::I32(hd as i32),
                    Arg::F32(c.attention_scale),
                    Arg::I32(window),
                    Arg::Ptr(0),
                    Arg::Ptr(b.cast.ptr),
                    Arg::I32(l.o.w.elem as i32),
                ],
            )?;
            self.matmul(&l.o, b.cast.ptr, n, b.o.ptr)?;
            pending = self.branch_norm(b, l.attn_out_norm.as_ref(), n)?;
            // MLP.
            self.norm(input(pending), &l.mlp_norm, n, d, 0, 0, b.cast.ptr, l.gate_up.w.elem)?;
            self.matmul(&l.gate_up, b.cast.ptr, n, b.gu.ptr)?;
            let total = n * inter;
            g.launch_flat(
                &k.gated,
                total,
                &[
                    Arg::Ptr(b.gu.ptr),
                    Arg::Ptr(b.cast.ptr),
                    Arg::I32(l.down.w.elem as i32),
                    Arg::I32(inter as i32),
                    Arg::I32(gelu),
                    Arg::U64(total as u64),
                ],
            )?;
            self.matmul(&l.down, b.cast.ptr, n, b.o.ptr)?;
            pending = self.branch_norm(b, l.mlp_out_norm.as_ref(), n)?;
        }
        if pending {
            g.launch_flat(&k.add, n * d, &[Arg::Ptr(b.x.ptr), Arg::Ptr(b.o.ptr), Arg::U64((n * d) as u64)])?;
        }
        // The rows whose output is wanted, through the final norm (and the head).
        let m = shape.rows;
        if m == 0 {
            return Ok(());
        }
        g.launch(
            &k.gather,
            (m as u32, 1),
            256,
            &[Arg::Ptr(b.x.ptr), Arg::Ptr(b.rows.ptr), Arg::Ptr(b.last.ptr), Arg::I32(d as i32)],
        )?;
        let head = self.lm_head.as_ref().unwrap_or(&self.embed);
        if shape.want == Want::Hidden {
            self.norm((b.last.ptr, 0), &self.norm, m, d, 0, b.out.ptr, 0, Elem::F32)?;
        } else {
            self.norm((b.last.ptr, 0), &self.norm, m, d, 0, 0, b.cast.ptr, head.w.elem)?;
            self.matmul(head, b.cast.ptr, m, b.out.ptr)?;
            if let Some(cap) = c.final_logit_softcap {
                let total = m * c.vocab;
                g.launch_flat(&k.softcap, total, &[Arg::Ptr(b.out.ptr), Arg::F32(cap), Arg::U64(total as u64)])?;
            }
            if shape.want == Want::Pick {
                self.pick_rows(b, m)?;
            }
        }
        Ok(())
    }

    /// Picks the ids of the `m` output rows of `b.out` as `b.picks` says, into `b.picked`: the
    /// passes of kernels.cu, each over every row at once, each row read by many blocks.
    fn pick_rows(&self, b: &StepBuffers, m: usize) -> Result<(), GpuError> {
        let vocab = self.config.vocab;
        let [max, coarse, fine, low, weights, choose] = &self.gpu.k.pick;
        let chunk = pick_chunk(vocab, m);
        let args = [
            Arg::Ptr(b.out.ptr),
            Arg::I32(vocab as i32),
            Arg::I32(chunk as i32),
            Arg::Ptr(b.picks.ptr),
            Arg::Ptr(b.pick_scratch.ptr),
        ];
        let (rows, chunks) = (m as u32, vocab.div_ceil(chunk) as u32);
        for pass in [max, coarse, fine, low] {
            self.gpu.launch(pass, (rows, chunks), PICK_THREADS, &args)?;
        }
        let groups = vocab.div_ceil(DRAW_BLOCK).div_ceil(WEIGHT_THREADS as usize / 8) as u32;
        self.gpu.launch(weights, (rows, groups), WEIGHT_THREADS, &args)?;
        let [out, width, chunk, picks, scratch] = args;
        self.gpu.launch(choose, (rows, 1), CHOOSE_THREADS, &[out, width, chunk, picks, scratch, Arg::Ptr(b.picked.ptr)])
    }

    /// Gemma norms a branch's output before adding it to `x` (`x += norm(o)`, done here; false);
    /// llama adds it as it is, left to the next norm (true: pending).
    fn branch_norm(&self, b: &StepBuffers, norm: Option<&DevBuf>, n: usize) -> Result<bool, GpuError> {
        match norm {
            Some(w) => {
                self.norm((b.o.ptr, 0), w, n, self.config.hidden, b.x.ptr, 0, 0, Elem::F32)?;
                Ok(false)
            }
            None => Ok(true),
        }
    }
}

const _: () = assert!(BLOCK_TOKENS == 16, "kernels.cu assumes 16-token blocks");

/// Ids per block of the pick passes over chunks of `vocab` with `rows` rows: about 512 blocks a
/// pass (rows x chunks), at least [`PICK_CHUNK`] ids, and at most [`PICK_CHUNKS`] chunks (a
/// greedy pick takes any vocabulary).
fn pick_chunk(vocab: usize, rows: usize) -> usize {
    vocab.div_ceil((512 / rows).max(1)).max(vocab.div_ceil(PICK_CHUNKS)).next_multiple_of(PICK_CHUNK)
}

/// The pick kernels' row modes and floats per row (kernels.cu).
const PICK_ARGMAX: f32 = 0.0;
const PICK_DRAW: f32 = 1.0;
const PICK_NONE: f32 = 2.0;
const PICK_FLOATS: usize = 5;
/// kernels.cu's `DRAW_BLOCK`, and `DRAW_BLOCKS` x `DRAW_BLOCK`.
const DRAW_BLOCK: usize = 512;
const DRAW_MAX_VOCAB: usize = 1024 * DRAW_BLOCK;
/// kernels.cu's `PICK_CHUNK` (the fewest ids per block in the passes over a row) and
/// `PICK_CHUNKS` (the most chunks a row's scratch holds).
const PICK_CHUNK: usize = 4096;
const PICK_CHUNKS: usize = DRAW_MAX_VOCAB / PICK_CHUNK;
/// `sizeof(PickScratch)` in kernels.cu, given to NVRTC, which checks it.
pub(super) const PICK_SCRATCH_BYTES: usize = 26_112;
/// Threads per block of the passes over chunks (16 ids each, or more with many rows), of
/// `pick_weights` (eight per block of ids: 16 blocks of ids) and of `pick_choose` (one per id
/// of the block it walks).
const PICK_THREADS: u32 = 256;
const WEIGHT_THREADS: u32 = 128;
const CHOOSE_THREADS: u32 = 512;

/// `ATT_WARPS` (kernels.cu) warps per attention block.
const ATTENTION_THREADS: u32 = 4 * 32;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pick_chunks_spread_a_row_over_blocks_and_fit_its_scratch() {
        // Gemma 3's vocabulary: 64 blocks a row alone, 8 of 32,768 ids at 64 rows.
        assert_eq!(pick_chunk(262_144, 1), 4096);
        assert_eq!(pick_chunk(262_144, 16), 8192);
        assert_eq!(pick_chunk(262_144, 64), 32_768);
        // A vocabulary smaller than a chunk, and more rows than blocks wanted: one chunk a row.
        assert_eq!(pick_chunk(100, 1), 4096);
        assert_eq!(pick_chunk(151_936, 1000), 155_648);
        for vocab in [1, 4095, 4097, 49_152, 151_936, 262_144, DRAW_MAX_VOCAB, 2_000_000] {
            for rows in [1, 2, 3, 7, 64, 513] {
                let chunk = pick_chunk(vocab, rows);
                assert!(chunk.is_multiple_of(PICK_CHUNK) && chunk >= PICK_CHUNK, "{vocab} ids, {rows} rows");
                assert!(vocab.div_ceil(chunk) <= PICK_CHUNKS, "{vocab} ids, {rows} rows: too many chunks");
            }
        }
    }
}
