//! The subset LM head: the shortlisted rows of the model's output matrix, copied out of the GGUF in their
//! quantized type, on a ggml backend device, scored with `ggml_mul_mat` through the generic ggml backend
//! API (no backend-specific code: CPU here, CUDA/Metal wherever libggml was built with them).
//!
//! Also here: the margin fallback ([`needs_full_head`]) and a certificate that the subset argmax is the
//! full argmax ([`RowStats`], [`OutsideBound`]): for a row j outside the set assigned to centroid c,
//! `w_j·h = c·h + (w_j − c)·h ≤ c·h + ‖w_j − c‖·‖h‖` (Cauchy–Schwarz; the head has no bias). The largest
//! such bound over the outside rows, if below the subset's top logit, proves no outside row wins.

use crate::llama::{init, sys, GgufFile, TensorInfo};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::ptr::{null_mut, NonNull};

#[derive(Debug, thiserror::Error)]
pub enum HeadError {
    #[error("{path}: {reason}")]
    Model { path: String, reason: String },
    #[error("{path}: {err}")]
    Io { path: String, err: std::io::Error },
    #[error("ggml: {0}")]
    Ggml(String),
}

/// The head tensor of a GGUF and how to read its rows.
#[derive(Clone, Debug)]
pub struct HeadInfo {
    pub path: String,
    pub tensor: TensorInfo,
    pub n_embd: usize,
    pub n_vocab: usize,
    pub row_bytes: usize,
}

impl HeadInfo {
    /// Finds `output.weight` (or `token_embd.weight` when tied) and checks its geometry against the file.
    pub fn open(path: &Path) -> Result<HeadInfo, HeadError> {
        let p = path.display().to_string();
        let err = |reason: String| HeadError::Model { path: p.clone(), reason };
        let g = GgufFile::open(path).map_err(|e| err(e.to_string()))?;
        let t = g.head_tensor().ok_or_else(|| err("no output.weight or token_embd.weight tensor".into()))?;
        if t.shape.len() != 2 || t.shape[0] <= 0 || t.shape[1] <= 0 {
            return Err(err(format!("{}: shape {:?} is not a matrix", t.name, t.shape)));
        }
        let (n_embd, n_vocab) = (t.shape[0] as usize, t.shape[1] as usize);
        // SAFETY: plain queries on a type id read from the file; ggml validates nothing, so check the
        // block size divides the row first (ggml_row_size asserts it).
        let row_bytes = unsafe {
            let blck = sys::ggml_blck_size(t.ggml_type);
            if blck <= 0 || n_embd as i64 % blck != 0 {
                return Err(err(format!("{}: row of {n_embd} is not a whole number of {} blocks", t.name, t.type_name)));
            }
            sys::ggml_row_size(t.ggml_type, n_embd as i64)
        };
        if (row_bytes * n_vocab) as u64 != t.size {
            return Err(err(format!("{}: {} bytes for {n_vocab} rows of {row_bytes}", t.name, t.size)));
        }
        let len = std::fs::metadata(path).map_err(|e| HeadError::Io { path: p.clone(), err: e })?.len();
        if t.offset.checked_add(t.size).is_none_or(|end| end > len) {
            return Err(err(format!("{}: data [{}, +{}) runs past the end of the file ({len} bytes)", t.name, t.offset, t.size)));
        }
        Ok(HeadInfo { path: p, tensor: t, n_embd, n_vocab, row_bytes })
    }

    /// Raw (quantized) bytes of rows `ids`, concatenated in that order.
    pub fn read_rows(&self, ids: &[u32]) -> Result<Vec<u8>, HeadError> {
        let f = std::fs::File::open(&self.path).map_err(|e| HeadError::Io { path: self.path.clone(), err: e })?;
        let mut out = vec![0u8; ids.len() * self.row_bytes];
        // Runs of consecutive ids are read in one call.
        let mut i = 0;
        while i < ids.len() {
            let id = ids[i] as usize;
            if id >= self.n_vocab {
                return Err(HeadError::Model { path: self.path.clone(), reason: format!("row {id} out of range ({} rows)", self.n_vocab) });
            }
            let mut j = i + 1;
            while j < ids.len() && ids[j] as usize == ids[j - 1] as usize + 1 && j - i < 4096 {
                j += 1;
            }
            let off = self.tensor.offset + (id * self.row_bytes) as u64;
            f.read_exact_at(&mut out[i * self.row_bytes..j * self.row_bytes], off)
                .map_err(|e| HeadError::Io { path: self.path.clone(), err: e })?;
            i = j;
        }
        Ok(out)
    }

    /// Rows converted to f32 with ggml's own dequantizer (`to_float` of the type's traits).
    pub fn dequantize(&self, raw: &[u8]) -> Vec<f32> {
        let n = raw.len() / self.row_bytes;
        let mut out = vec![0f32; n * self.n_embd];
        if self.tensor.ggml_type == sys::GGML_TYPE_F32 {
            for (o, b) in out.iter_mut().zip(raw.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
            return out;
        }
        // SAFETY: the traits are static data of ggml; to_float reads k = n·n_embd values (whole rows, a
        // multiple of the block size, checked in open) from raw and writes k floats to out.
        unsafe {
            let tr = sys::ggml_get_type_traits(self.tensor.ggml_type);
            let f = (*tr).to_float.expect("ggml type without to_float");
            f(raw.as_ptr().cast(), out.as_mut_ptr(), (n * self.n_embd) as i64);
        }
        out
    }
}

/// Where the head runs.
#[derive(Clone, Debug)]
pub struct HeadOptions {
    /// Threads of the CPU backend.
    pub n_threads: i32,
    /// Use the best device ggml has (a GPU when libggml was built with one) instead of the CPU.
    pub best_device: bool,
}

impl Default for HeadOptions {
    fn default() -> Self {
        HeadOptions { n_threads: 2, best_device: false }
    }
}

/// A compute graph for a fixed number of hidden-state columns, reused across calls.
struct Graph {
    ctx: NonNull<sys::ggml_context>,
    buf: sys::ggml_backend_buffer_t,
    gf: *mut sys::ggml_cgraph,
    h: *mut sys::ggml_tensor,
    out: *mut sys::ggml_tensor,
    n_cols: usize,
}

impl Drop for Graph {
    fn drop(&mut self) {
        // SAFETY: both were created by us for this graph and are freed once.
        unsafe {
            sys::ggml_backend_buffer_free(self.buf);
            sys::ggml_free(self.ctx.as_ptr());
        }
    }
}

fn ggml_ctx(n_tensors: usize, graph: bool) -> Result<NonNull<sys::ggml_context>, HeadError> {
    // SAFETY: overhead queries are pure; with no_alloc the context holds only tensor metadata.
    let ctx = unsafe {
        let size = sys::ggml_tensor_overhead() * n_tensors + if graph { sys::ggml_graph_overhead() } else { 0 } + 1024;
        sys::ggml_init(sys::ggml_init_params { mem_size: size, mem_buffer: null_mut(), no_alloc: true })
    };
    NonNull::new(ctx).ok_or_else(|| HeadError::Ggml("ggml_init failed".into()))
}

/// The rows `ids` of a model's LM head on a ggml backend: logits for those ids only.
pub struct SubsetHead {
    ids: Vec<u32>,
    n_embd: usize,
    ggml_type: u32,
    backend: NonNull<sys::ggml_backend>,
    wctx: NonNull<sys::ggml_context>,
    wbuf: sys::ggml_backend_buffer_t,
    w: *mut sys::ggml_tensor,
    graph: Option<Graph>,
}

// SAFETY: the backend, buffers and contexts are owned by this value and used through &mut self only.
unsafe impl Send for SubsetHead {}

impl Drop for SubsetHead {
    fn drop(&mut self) {
        self.graph = None;
        // SAFETY: owned objects, freed once, the graph (which uses the backend) first.
        unsafe {
            sys::ggml_backend_buffer_free(self.wbuf);
            sys::ggml_free(self.wctx.as_ptr());
            sys::ggml_backend_free(self.backend.as_ptr());
        }
    }
}

impl SubsetHead {
    /// Copies rows `ids` (in that order: row i of the subset is token ids[i]) of the head of the GGUF at
    /// `path` onto the backend, in their quantized type.
    pub fn from_gguf(path: &Path, ids: &[u32], opts: &HeadOptions) -> Result<SubsetHead, HeadError> {
        let info = HeadInfo::open(path)?;
        let raw = info.read_rows(ids)?;
        SubsetHead::from_rows(&info, ids, &raw, opts)
    }

    /// As [`SubsetHead::from_gguf`], from rows already read with [`HeadInfo::read_rows`].
    pub fn from_rows(info: &HeadInfo, ids: &[u32], raw: &[u8], opts: &HeadOptions) -> Result<SubsetHead, HeadError> {
        if ids.is_empty() || raw.len() != ids.len() * info.row_bytes {
            return Err(HeadError::Ggml(format!("{} ids but {} bytes of rows", ids.len(), raw.len())));
        }
        init();
        // SAFETY: generic backend API. The device pointer comes from ggml's registry; every returned
        // pointer is checked before use and owned (freed in Drop, or here on error).
        let backend = unsafe {
            let b = if opts.best_device {
                sys::ggml_backend_init_best()
            } else {
                let dev = sys::ggml_backend_dev_by_type(sys::GGML_BACKEND_DEVICE_TYPE_CPU);
                if dev.is_null() {
                    null_mut()
                } else {
                    sys::ggml_backend_dev_init(dev, std::ptr::null())
                }
            };
            let b = NonNull::new(b).ok_or_else(|| HeadError::Ggml("no ggml backend device".into()))?;
            // Thread count through the registry's generic entry point (what llama.cpp does), present on
            // CPU-like backends only.
            let reg = sys::ggml_backend_dev_backend_reg(sys::ggml_backend_get_device(b.as_ptr()));
            if !reg.is_null() {
                let f = sys::ggml_backend_reg_get_proc_address(reg, c"ggml_backend_set_n_threads".as_ptr());
                if !f.is_null() {
                    // SAFETY: ggml-backend.h documents this name's type as ggml_backend_set_n_threads_t.
                    let f: unsafe extern "C" fn(sys::ggml_backend_t, std::os::raw::c_int) = std::mem::transmute(f);
                    f(b.as_ptr(), opts.n_threads.max(1));
                }
            }
            b
        };
        let wctx = match ggml_ctx(1, false) {
            Ok(c) => c,
            Err(e) => {
                // SAFETY: the backend was created above and is not used elsewhere.
                unsafe { sys::ggml_backend_free(backend.as_ptr()) };
                return Err(e);
            }
        };
        // SAFETY: wctx is a live no_alloc context; the tensor is [n_embd, K] of the file's type, so its
        // nbytes is exactly K·row_bytes = raw.len(), which tensor_set copies after allocation.
        unsafe {
            let w = sys::ggml_new_tensor_2d(wctx.as_ptr(), info.tensor.ggml_type, info.n_embd as i64, ids.len() as i64);
            let wbuf = sys::ggml_backend_alloc_ctx_tensors(wctx.as_ptr(), backend.as_ptr());
            if w.is_null() || wbuf.is_null() {
                sys::ggml_free(wctx.as_ptr());
                sys::ggml_backend_free(backend.as_ptr());
                return Err(HeadError::Ggml(format!("cannot allocate {} bytes of head rows on the backend", raw.len())));
            }
            assert_eq!(sys::ggml_nbytes(w), raw.len());
            sys::ggml_backend_tensor_set(w, raw.as_ptr().cast(), 0, raw.len());
            Ok(SubsetHead { ids: ids.to_vec(), n_embd: info.n_embd, ggml_type: info.tensor.ggml_type, backend, wctx, wbuf, w, graph: None })
        }
    }

    /// Token id of each subset row.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    pub fn n_embd(&self) -> usize {
        self.n_embd
    }

    /// The backend's name (e.g. "CPU").
    pub fn backend_name(&self) -> String {
        // SAFETY: live backend; the name is a static C string.
        unsafe { std::ffi::CStr::from_ptr(sys::ggml_backend_name(self.backend.as_ptr())).to_string_lossy().into_owned() }
    }

    fn graph(&mut self, n_cols: usize) -> Result<&Graph, HeadError> {
        if self.graph.as_ref().is_none_or(|g| g.n_cols != n_cols) {
            self.graph = None;
            let ctx = ggml_ctx(4, true)?;
            // SAFETY: ctx is a live no_alloc context; w lives in another context but ggml graphs may
            // reference tensors of other contexts that stay allocated (wbuf outlives the graph).
            unsafe {
                let h = sys::ggml_new_tensor_2d(ctx.as_ptr(), sys::GGML_TYPE_F32, self.n_embd as i64, n_cols as i64);
                let out = sys::ggml_mul_mat(ctx.as_ptr(), self.w, h);
                let gf = sys::ggml_new_graph(ctx.as_ptr());
                sys::ggml_build_forward_expand(gf, out);
                let buf = sys::ggml_backend_alloc_ctx_tensors(ctx.as_ptr(), self.backend.as_ptr());
                if buf.is_null() {
                    sys::ggml_free(ctx.as_ptr());
                    return Err(HeadError::Ggml(format!("cannot allocate the graph for {n_cols} columns")));
                }
                self.graph = Some(Graph { ctx, buf, gf, h, out, n_cols });
            }
        }
        Ok(self.graph.as_ref().unwrap())
    }

    /// Logits of the subset rows for `n_cols` hidden states (`hidden` is n_cols × n_embd, one state per
    /// row). Returns n_cols × len(): `out[c * len + i]` is the logit of token `ids[i]` for state c.
    pub fn logits(&mut self, hidden: &[f32], n_cols: usize) -> Result<Vec<f32>, HeadError> {
        let mut out = vec![0f32; n_cols * self.ids.len()];
        self.logits_into(hidden, n_cols, &mut out)?;
        Ok(out)
    }

    /// As [`SubsetHead::logits`], into a caller buffer of n_cols × len() floats.
    pub fn logits_into(&mut self, hidden: &[f32], n_cols: usize, out: &mut [f32]) -> Result<(), HeadError> {
        assert_eq!(hidden.len(), n_cols * self.n_embd, "hidden states must be n_cols × n_embd");
        assert_eq!(out.len(), n_cols * self.ids.len(), "output must be n_cols × subset size");
        let backend = self.backend.as_ptr();
        let g = self.graph(n_cols)?;
        // SAFETY: h holds n_cols·n_embd f32 and out n_cols·K f32 (the mul_mat result [K, n_cols],
        // contiguous, column c at c·K), both allocated on the backend; sizes asserted above.
        unsafe {
            sys::ggml_backend_tensor_set(g.h, hidden.as_ptr().cast(), 0, std::mem::size_of_val(hidden));
            let st = sys::ggml_backend_graph_compute(backend, g.gf);
            if st != sys::GGML_STATUS_SUCCESS {
                return Err(HeadError::Ggml(format!("graph compute failed with status {st}")));
            }
            sys::ggml_backend_tensor_get(g.out, out.as_mut_ptr().cast(), 0, std::mem::size_of_val(out));
        }
        Ok(())
    }

    /// The ggml type of the rows (e.g. q8_0), as its name.
    pub fn type_name(&self) -> String {
        // SAFETY: static C string of ggml.
        unsafe { std::ffi::CStr::from_ptr(sys::ggml_type_name(self.ggml_type)).to_string_lossy().into_owned() }
    }
}

/// Index of the largest and second largest values and the values: (top1 index, top1, top2).
pub fn top2(logits: &[f32]) -> (usize, f32, f32) {
    let (mut i1, mut v1, mut v2) = (0usize, f32::NEG_INFINITY, f32::NEG_INFINITY);
    for (i, &v) in logits.iter().enumerate() {
        if v > v1 {
            v2 = v1;
            v1 = v;
            i1 = i;
        } else if v > v2 {
            v2 = v;
        }
    }
    (i1, v1, v2)
}

/// The margin fallback: score the full head when the subset's top-1 − top-2 margin is under `threshold`.
pub fn needs_full_head(subset_logits: &[f32], threshold: f32) -> bool {
    let (_, a, b) = top2(subset_logits);
    a - b < threshold
}

/// Per-row facts of a whole head, computed once: norms, and each row's nearest of K centroids with the
/// distance to it. Centroids come from a few k-means rounds on a sample of rows.
pub struct RowStats {
    pub n_embd: usize,
    pub norms: Vec<f32>,
    pub centroids: Vec<f32>,
    pub cluster: Vec<u32>,
    pub radius: Vec<f32>,
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for k in 0..8 {
            acc[k] += x[k] * y[k];
        }
    }
    let tail: f32 = ra.iter().zip(rb).map(|(x, y)| x * y).sum();
    acc.iter().sum::<f32>() + tail
}

fn dist_f64(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(&x, &y)| (x as f64 - y as f64).powi(2)).sum::<f64>().sqrt()
}

impl RowStats {
    /// Reads every row of the head once (`progress(rows done)`), in blocks.
    pub fn compute(info: &HeadInfo, k: usize, sample: usize, seed: u64, mut progress: impl FnMut(usize)) -> Result<RowStats, HeadError> {
        let d = info.n_embd;
        let n = info.n_vocab;
        let mut rng = fastrand::Rng::with_seed(seed);
        // k-means on a sample.
        let mut sample_ids: Vec<u32> = (0..sample.min(n)).map(|_| rng.u32(0..n as u32)).collect();
        sample_ids.sort_unstable();
        sample_ids.dedup();
        let xs = info.dequantize(&info.read_rows(&sample_ids)?);
        let s = sample_ids.len();
        let k = k.clamp(1, s);
        let mut cents: Vec<f32> = (0..k).flat_map(|i| xs[(i * s / k) * d..(i * s / k + 1) * d].to_vec()).collect();
        let half_norms = |cents: &[f32]| -> Vec<f32> { cents.chunks_exact(d).map(|c| 0.5 * dot(c, c)).collect() };
        let nearest = |x: &[f32], cents: &[f32], hn: &[f32]| -> usize {
            // argmin ‖x − c‖² = argmax (x·c − ‖c‖²/2)
            let mut best = (f32::NEG_INFINITY, 0usize);
            for (j, c) in cents.chunks_exact(d).enumerate() {
                let v = dot(x, c) - hn[j];
                if v > best.0 {
                    best = (v, j);
                }
            }
            best.1
        };
        for _ in 0..4 {
            let mut sum = vec![0f64; k * d];
            let mut cnt = vec![0usize; k];
            let hn = half_norms(&cents);
            for x in xs.chunks_exact(d) {
                let j = nearest(x, &cents, &hn);
                cnt[j] += 1;
                for (s, &v) in sum[j * d..(j + 1) * d].iter_mut().zip(x) {
                    *s += v as f64;
                }
            }
            for j in 0..k {
                if cnt[j] > 0 {
                    for t in 0..d {
                        cents[j * d + t] = (sum[j * d + t] / cnt[j] as f64) as f32;
                    }
                }
            }
        }
        // Every row: norm, nearest centroid, distance.
        let mut norms = Vec::with_capacity(n);
        let mut cluster = Vec::with_capacity(n);
        let mut radius = Vec::with_capacity(n);
        let block = 2048;
        let hn = half_norms(&cents);
        for start in (0..n).step_by(block) {
            let ids: Vec<u32> = (start as u32..(start + block).min(n) as u32).collect();
            let rows = info.dequantize(&info.read_rows(&ids)?);
            for x in rows.chunks_exact(d) {
                let j = nearest(x, &cents, &hn);
                norms.push(x.iter().map(|&v| (v as f64).powi(2)).sum::<f64>().sqrt() as f32);
                cluster.push(j as u32);
                radius.push(dist_f64(x, &cents[j * d..(j + 1) * d]) as f32);
            }
            progress(start + ids.len());
        }
        Ok(RowStats { n_embd: d, norms, centroids: cents, cluster, radius })
    }
}

/// Upper bounds on the logits of every row outside a set, for any hidden state.
pub struct OutsideBound {
    n_embd: usize,
    /// Largest norm of an outside row.
    max_norm: f64,
    /// Centroids that have outside rows, and the largest distance of one of those rows to it.
    centroids: Vec<f32>,
    radius: Vec<f64>,
}

/// The two bounds of one hidden state (see [`OutsideBound::bound`]).
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    /// max over outside rows of ‖w_j‖·‖h‖.
    pub norm: f64,
    /// max over clusters of c·h + r·‖h‖.
    pub cluster: f64,
}

impl OutsideBound {
    /// `inset[id]` is true for ids in the set.
    pub fn new(stats: &RowStats, inset: &[bool]) -> OutsideBound {
        let d = stats.n_embd;
        let k = stats.centroids.len() / d;
        let mut rad = vec![f64::NEG_INFINITY; k];
        let mut max_norm = 0f64;
        for (id, &inside) in inset.iter().enumerate() {
            if !inside {
                max_norm = max_norm.max(stats.norms[id] as f64);
                let c = stats.cluster[id] as usize;
                rad[c] = rad[c].max(stats.radius[id] as f64);
            }
        }
        let mut centroids = Vec::new();
        let mut radius = Vec::new();
        for (c, &r) in stats.centroids.chunks_exact(d).zip(&rad) {
            if r > f64::NEG_INFINITY {
                centroids.extend_from_slice(c);
                radius.push(r);
            }
        }
        OutsideBound { n_embd: d, max_norm, centroids, radius }
    }

    /// Bounds on max_j∉set w_j·h in exact arithmetic (f64): the norm bound and the cluster bound.
    pub fn bound(&self, h: &[f32]) -> Bounds {
        let hn = h.iter().map(|&v| (v as f64).powi(2)).sum::<f64>().sqrt();
        let mut cl = f64::NEG_INFINITY;
        for (c, &r) in self.centroids.chunks_exact(self.n_embd).zip(&self.radius) {
            let ch: f64 = c.iter().zip(h).map(|(&a, &b)| a as f64 * b as f64).sum();
            cl = cl.max(ch + r * hn);
        }
        Bounds { norm: self.max_norm * hn, cluster: cl }
    }

    /// True when the subset's top logit beats every outside row: `top1 − slack > bound`. `slack` covers
    /// the difference between computed and exact logits (activation quantization of the kernels).
    pub fn certifies(bound: f64, subset_top1: f32, slack: f32) -> bool {
        (subset_top1 - slack) as f64 > bound
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top2_and_margin() {
        assert_eq!(top2(&[1.0, 5.0, 4.5, 2.0]), (1, 5.0, 4.5));
        assert!(needs_full_head(&[1.0, 5.0, 4.5], 0.6));
        assert!(!needs_full_head(&[1.0, 5.0, 4.5], 0.5));
    }

    #[test]
    fn dot_matches_naive() {
        let a: Vec<f32> = (0..21).map(|i| i as f32 * 0.5).collect();
        let b: Vec<f32> = (0..21).map(|i| 1.0 - i as f32 * 0.1).collect();
        let naive: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        assert!((dot(&a, &b) - naive).abs() < 1e-3);
    }
}
