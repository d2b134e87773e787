//! The subset LM head: the shortlisted rows of the model's output matrix, copied out of the GGUF in their
//! quantized type, on a ggml backend device, scored with `ggml_mul_mat` through the generic ggml backend
//! API (no backend-specific code: CPU here, CUDA/Metal wherever libggml was built with them).
//!
//! Also here: the margin fallback ([`needs_full_head`]) and a certificate that the subset argmax is the
//! full argmax ([`certify`]): a bound on every outside row's logit from a projection onto a few principal
//! directions of the hidden states plus a residual ([`ProjectedBound`]), and exact rescoring of the few
//! rows that bound cannot exclude.

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

/// Which ggml device holds the head's rows and scores them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadDevice {
    /// ggml's CPU backend.
    Cpu,
    /// `ggml_backend_init_best`: the first GPU, else an integrated GPU, else the CPU. llama.cpp offloads a
    /// model's layers in that same order, so a fully offloaded draft model and its head share a device.
    Best,
}

impl HeadDevice {
    /// The name `head_dev=` takes.
    pub fn as_str(self) -> &'static str {
        match self {
            HeadDevice::Cpu => "cpu",
            HeadDevice::Best => "best",
        }
    }
}

/// Where the head runs.
#[derive(Clone, Debug)]
pub struct HeadOptions {
    /// Threads of the CPU backend.
    pub n_threads: i32,
    pub device: HeadDevice,
}

impl Default for HeadOptions {
    /// The CPU: the offline tools (`shortlist report`) time and compare heads there.
    fn default() -> Self {
        HeadOptions { n_threads: 2, device: HeadDevice::Cpu }
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
    /// Copies rows `ids` (in that order: row i of the subset is token `ids[i]`) of the head of the GGUF at
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
            let b = if opts.device == HeadDevice::Best {
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

    /// The backend's name (e.g. "CPU", "Vulkan0").
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

/// The margin fallback: score the full head when the subset's top-1 − top-2 logit margin is under
/// `threshold` (the two best logits of every row scored, [`top2`] of them).
pub fn needs_full_head(top1: f32, top2: f32, threshold: f32) -> bool {
    top1 - top2 < threshold
}

/// The whole head in memory in its quantized type (q8_0: 1.06 bytes a weight), for exact logits of single
/// rows: the certificate rescores a different set of rows at every position, too scattered to read from
/// the file each time.
pub struct HeadRows {
    pub info: HeadInfo,
    raw: Vec<u8>,
}

impl HeadRows {
    pub fn read(info: HeadInfo) -> Result<HeadRows, HeadError> {
        let raw = info.read_rows(&(0..info.n_vocab as u32).collect::<Vec<_>>())?;
        Ok(HeadRows { info, raw })
    }

    /// Rows `start..end`, dequantized by ggml (`to_float`).
    pub fn dequantized(&self, start: usize, end: usize) -> Vec<f32> {
        let rb = self.info.row_bytes;
        self.info.dequantize(&self.raw[start * rb..end * rb])
    }

    /// The exact logit of row `j` for hidden state `h`: [`exact_dot`] of the dequantized row.
    pub fn exact_logit(&self, j: usize, h: &[f32]) -> f64 {
        exact_dot(&self.dequantized(j, j + 1), h)
    }
}

/// Dot product in f64 of two f32 vectors: every product is exact (24 + 24 bits fit in 53), only the sum
/// rounds, by about n·2⁻⁵³ of the sum of |products| (≈ 1e-11 on these logits).
pub fn exact_dot(w: &[f32], h: &[f32]) -> f64 {
    dot_with(w, h)
}

fn dot_f64(a: &[f64], b: &[f64]) -> f64 {
    dot_with(a, b)
}

/// Σ a_i·b_i in f64, in four interleaved partial sums so that the compiler vectorizes it.
fn dot_with<A: Copy + Into<f64>, B: Copy + Into<f64>>(a: &[A], b: &[B]) -> f64 {
    let (ca, cb) = (a.chunks_exact(4), b.chunks_exact(4));
    let tail: f64 = ca.remainder().iter().zip(cb.remainder()).map(|(&x, &y)| x.into() * y.into()).sum();
    let mut acc = [0f64; 4];
    for (x, y) in ca.zip(cb) {
        for k in 0..4 {
            acc[k] += x[k].into() * y[k].into();
        }
    }
    acc[0] + acc[1] + acc[2] + acc[3] + tail
}

/// Modified Gram–Schmidt over the rows of `q` (d values each), run twice ("twice is enough" for
/// orthogonality to rounding). A row that is numerically in the span of the earlier ones (a sample of
/// rank below the block size) is replaced by a random one, so the result is always orthonormal.
fn orthonormalize(q: &mut [f64], d: usize, rng: &mut fastrand::Rng) {
    for i in 0..q.len() / d {
        let (done, rest) = q.split_at_mut(i * d);
        let qi = &mut rest[..d];
        loop {
            let before = dot_f64(qi, qi).sqrt();
            for _ in 0..2 {
                for qj in done.chunks_exact(d) {
                    let p = dot_f64(qi, qj);
                    qi.iter_mut().zip(qj).for_each(|(a, &b)| *a -= p * b);
                }
            }
            let n = dot_f64(qi, qi).sqrt();
            if n > 0.0 && n > 1e-10 * before {
                qi.iter_mut().for_each(|a| *a /= n);
                break;
            }
            qi.iter_mut().for_each(|a| *a = rng.f64() - 0.5);
        }
    }
}

/// Eigen-decomposition of a small symmetric n × n matrix (row-major) by cyclic Jacobi rotations, to
/// rounding: the eigenvalues, and V (row-major) whose column c is the unit eigenvector of value c.
fn jacobi_eigen(mut a: Vec<f64>, n: usize) -> (Vec<f64>, Vec<f64>) {
    let mut v = vec![0f64; n * n];
    (0..n).for_each(|i| v[i * n + i] = 1.0);
    let total: f64 = a.iter().map(|x| x * x).sum();
    for _sweep in 0..64 {
        let off: f64 = (0..n).map(|p| (p + 1..n).map(|q| a[p * n + q] * a[p * n + q]).sum::<f64>()).sum();
        if off <= 1e-30 * total {
            break;
        }
        for p in 0..n {
            for q in p + 1..n {
                let apq = a[p * n + q];
                if apq == 0.0 {
                    continue;
                }
                // The rotation by φ in the (p, q) plane with tan φ = t zeroes a[p][q] (t² + 2θt = 1,
                // the smaller root, so |φ| ≤ π/4).
                let theta = (a[q * n + q] - a[p * n + p]) / (2.0 * apq);
                let t = if theta.abs() > 1e100 { 0.5 / theta } else { theta.signum() / (theta.abs() + (theta * theta + 1.0).sqrt()) };
                let c = 1.0 / (t * t + 1.0).sqrt();
                let s = t * c;
                for k in 0..n {
                    let (kp, kq) = (a[k * n + p], a[k * n + q]);
                    a[k * n + p] = c * kp - s * kq;
                    a[k * n + q] = s * kp + c * kq;
                }
                for k in 0..n {
                    let (pk, qk) = (a[p * n + k], a[q * n + k]);
                    a[p * n + k] = c * pk - s * qk;
                    a[q * n + k] = s * pk + c * qk;
                }
                for k in 0..n {
                    let (kp, kq) = (v[k * n + p], v[k * n + q]);
                    v[k * n + p] = c * kp - s * kq;
                    v[k * n + q] = s * kp + c * kq;
                }
            }
        }
    }
    ((0..n).map(|i| a[i * n + i]).collect(), v)
}

/// Each row of `q` (d values) times the symmetric d × d matrix `m`.
fn mul_rows(m: &[f64], q: &[f64], d: usize) -> Vec<f64> {
    q.chunks_exact(d).flat_map(|x| m.chunks_exact(d).map(move |mrow| dot_f64(mrow, x))).collect()
}

/// The top `r` principal directions of `samples` (n vectors of d values, one after another) without
/// centring, i.e. the leading eigenvectors of the second moment Σ x xᵀ: r orthonormal rows of d values,
/// largest eigenvalue first. Uncentred because the bound needs the directions that hold most of ‖h‖²,
/// mean included. Block subspace iteration (r + 8 vectors, re-orthonormalized at every step, until the
/// captured energy stops growing), then Rayleigh–Ritz with Jacobi on the small projected matrix. Written
/// here rather than taken from a linear-algebra crate: it is short, and only this needs one. Any
/// orthonormal rows keep [`ProjectedBound`] exact; accuracy here only makes it tighter.
pub fn principal_directions(samples: &[f32], d: usize, r: usize) -> Vec<f64> {
    let r = r.min(d);
    let mut m = vec![0f64; d * d];
    for x in samples.chunks_exact(d) {
        for i in 0..d {
            let xi = x[i] as f64;
            m[i * d + i..(i + 1) * d].iter_mut().zip(&x[i..]).for_each(|(mij, &xj)| *mij += xi * xj as f64);
        }
    }
    for i in 0..d {
        for j in 0..i {
            m[i * d + j] = m[j * d + i];
        }
    }
    let k = (r + 8).min(d);
    let mut rng = fastrand::Rng::with_seed(0x6b6f6c6d);
    let mut q: Vec<f64> = (0..k * d).map(|_| rng.f64() - 0.5).collect();
    orthonormalize(&mut q, d, &mut rng);
    let mut energy = f64::NEG_INFINITY;
    for _ in 0..500 {
        let z = mul_rows(&m, &q, d);
        let e: f64 = q.chunks_exact(d).zip(z.chunks_exact(d)).map(|(a, b)| dot_f64(a, b)).sum();
        q = z;
        orthonormalize(&mut q, d, &mut rng);
        if (e - energy).abs() <= 1e-13 * e.abs() {
            break;
        }
        energy = e;
    }
    let z = mul_rows(&m, &q, d);
    let mut t = vec![0f64; k * k];
    for i in 0..k {
        for j in 0..k {
            t[i * k + j] = 0.5 * (dot_f64(&q[i * d..(i + 1) * d], &z[j * d..(j + 1) * d]) + dot_f64(&q[j * d..(j + 1) * d], &z[i * d..(i + 1) * d]));
        }
    }
    let (vals, vecs) = jacobi_eigen(t, k);
    let mut order: Vec<usize> = (0..k).collect();
    order.sort_by(|&x, &y| vals[y].total_cmp(&vals[x]));
    let mut u = vec![0f64; r * d];
    for (ui, &c) in u.chunks_exact_mut(d).zip(&order[..r]) {
        for (l, ql) in q.chunks_exact(d).enumerate() {
            let w = vecs[l * k + c];
            ui.iter_mut().zip(ql).for_each(|(a, &b)| *a += w * b);
        }
    }
    orthonormalize(&mut u, d, &mut rng);
    u
}

/// A hidden state seen through a [`ProjectedBound`]'s directions: b = U h, ‖b‖, ρ = ‖h − Uᵀb‖.
pub struct Projection {
    b: Vec<f64>,
    b_norm: f64,
    rho: f64,
}

impl Projection {
    /// ρ, the norm of the part of h outside the directions.
    pub fn residual_norm(&self) -> f64 {
        self.rho
    }
}

/// Upper bounds on the logit of every head row for any hidden state, from r directions U (orthonormal
/// rows, [`principal_directions`] of sample hidden states). Per row j: a_j = U w_j (stored f32), the
/// residual r_j = w_j − Uᵀa_j and e_j = ‖r_j‖; per hidden state: b = U h, ρ = ‖h − Uᵀb‖. Then exactly
///
///   w_j·h = a_j·b + (U r_j)·b + r_j·(h − Uᵀb) ≤ a_j·b + γ·‖b‖ + e_j·ρ      (Cauchy–Schwarz twice)
///
/// with γ = max_j ‖U r_j‖, which would be 0 for exact a_j and is what rounding a_j to f32 leaves (≈1e-7):
/// no orthonormality is assumed. It costs r multiply-adds per row instead of n_embd, and it is tight only
/// when h's energy sits in the r directions (ρ ≪ ‖h‖); on SmolLM2 32 directions miss about half of ‖h‖,
/// so it excludes few rows (docs/shortlist.md). Arithmetic in f64 (see [`exact_dot`] for its rounding).
pub struct ProjectedBound {
    n_embd: usize,
    r: usize,
    u: Vec<f64>,
    /// U Uᵀ (r × r), ≈ I; for e_j and U r_j without forming r_j.
    g: Vec<f64>,
    a: Vec<f32>,
    e: Vec<f64>,
    gamma: f64,
}

impl ProjectedBound {
    /// For directions `u` (r rows of `n_embd`), no head rows yet.
    pub fn new(u: Vec<f64>, n_embd: usize) -> ProjectedBound {
        assert!(n_embd > 0 && !u.is_empty() && u.len().is_multiple_of(n_embd), "directions must be one or more rows of n_embd values");
        let r = u.len() / n_embd;
        let g = (0..r * r).map(|x| dot_f64(&u[x / r * n_embd..(x / r + 1) * n_embd], &u[x % r * n_embd..(x % r + 1) * n_embd])).collect();
        ProjectedBound { n_embd, r, u, g, a: Vec::new(), e: Vec::new(), gamma: 0.0 }
    }

    /// The bound over a whole head: every row, in blocks (`progress(rows done)`).
    pub fn of_head(head: &HeadRows, u: Vec<f64>, mut progress: impl FnMut(usize)) -> ProjectedBound {
        let mut pb = ProjectedBound::new(u, head.info.n_embd);
        let n = head.info.n_vocab;
        for start in (0..n).step_by(4096) {
            let end = (start + 4096).min(n);
            pb.add_rows(&head.dequantized(start, end));
            progress(end);
        }
        pb
    }

    /// Appends rows (dequantized, `n_embd` values each) as the next ids.
    pub fn add_rows(&mut self, rows: &[f32]) {
        let (d, r) = (self.n_embd, self.r);
        let mut ax = vec![0f64; r];
        for w in rows.chunks_exact(d) {
            // a_x = U w in f64, a = a_x rounded to f32. With G = U Uᵀ:
            //   ‖r_j‖² = ‖w‖² − 2 a·a_x + aᵀ G a,   U r_j = a_x − G a.
            for (x, ui) in ax.iter_mut().zip(self.u.chunks_exact(d)) {
                *x = dot_with(ui, w);
            }
            let a: Vec<f64> = ax.iter().map(|&x| x as f32 as f64).collect();
            let ww = exact_dot(w, w);
            let mut aga = 0f64;
            let mut c2 = 0f64;
            for (i, gi) in self.g.chunks_exact(r).enumerate() {
                let ga = dot_f64(gi, &a);
                aga += a[i] * ga;
                c2 += (ax[i] - ga) * (ax[i] - ga);
            }
            // The 1e-12·‖w‖² covers the cancellation in ‖r_j‖² (rounding of r + r² terms of size ‖w‖²,
            // ≈1e-13·‖w‖² here), so e_j is never below the true residual norm.
            let e2 = ww - 2.0 * dot_f64(&a, &ax) + aga;
            self.e.push((e2.max(0.0) + 1e-12 * ww).sqrt());
            self.gamma = self.gamma.max(c2.sqrt() * (1.0 + 1e-6));
            self.a.extend(a.iter().map(|&x| x as f32));
        }
    }

    /// Number of directions r.
    pub fn dims(&self) -> usize {
        self.r
    }

    /// Number of head rows bounded.
    pub fn len(&self) -> usize {
        self.e.len()
    }

    pub fn is_empty(&self) -> bool {
        self.e.is_empty()
    }

    pub fn project(&self, h: &[f32]) -> Projection {
        let d = self.n_embd;
        assert_eq!(h.len(), d, "hidden state must have n_embd values");
        let b: Vec<f64> = self.u.chunks_exact(d).map(|ui| dot_with(ui, h)).collect();
        let mut res: Vec<f64> = h.iter().map(|&x| x as f64).collect();
        for (ui, &bi) in self.u.chunks_exact(d).zip(&b) {
            res.iter_mut().zip(ui).for_each(|(x, &p)| *x -= bi * p);
        }
        Projection { b_norm: dot_f64(&b, &b).sqrt(), rho: dot_f64(&res, &res).sqrt(), b }
    }

    /// The bound on row `j`'s exact logit w_j·h (≥ [`exact_dot`] of the row with h).
    pub fn bound(&self, j: usize, p: &Projection) -> f64 {
        dot_with(&self.a[j * self.r..(j + 1) * self.r], &p.b) + self.e[j] * p.rho + self.gamma * p.b_norm
    }
}

/// What the certificate found at one position.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Verdict {
    /// Outside rows whose bound did not exclude them (rescored exactly, until one failed).
    pub open: usize,
    /// No outside row can beat the subset's top logit in the kernel's arithmetic.
    pub certified: bool,
}

/// Certifies that no row in `outside` beats the subset's top logit `top1`, which is the kernel's (ggml's
/// mul_mat, bit-identical to llama.cpp's full head on the same rows). `slack` bounds |kernel − exact| for
/// any row (ggml rounds h to 8-bit blocks; measured ≤ 0.434 on SmolLM2, docs/shortlist.md), so an outside
/// row with exact logit x_j has kernel logit ≤ x_j + slack and cannot reach `top1` when
/// x_j + slack < top1. Its projected bound B_j ≥ x_j settles that without x_j when B_j < top1 − slack;
/// the rest are open and are rescored exactly with `exact(j)` (f64, dequantized row). Certified iff every
/// outside row passes; the strict inequality on the far side of the slack means kernel-vs-exact
/// differences up to `slack` cannot turn a certified position into a wrong one. After the first open row
/// that fails, the remaining open rows are only counted, not rescored.
pub fn certify(pb: &ProjectedBound, outside: &[u32], h: &[f32], top1: f32, slack: f32, mut exact: impl FnMut(u32) -> f64) -> Verdict {
    let p = pb.project(h);
    let t = top1 as f64 - slack as f64;
    let mut v = Verdict { open: 0, certified: true };
    for &j in outside {
        if pb.bound(j as usize, &p) >= t {
            v.open += 1;
            if v.certified && exact(j) >= t {
                v.certified = false;
            }
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top2_and_margin() {
        assert_eq!(top2(&[1.0, 5.0, 4.5, 2.0]), (1, 5.0, 4.5));
        let (_, a, b) = top2(&[1.0, 5.0, 4.5]);
        assert!(needs_full_head(a, b, 0.6));
        assert!(!needs_full_head(a, b, 0.5));
    }

    /// Householder reflection I − 2vvᵀ/‖v‖²: symmetric and orthogonal, so its rows are orthonormal.
    fn householder(d: usize) -> Vec<f64> {
        let v: Vec<f64> = (0..d).map(|i| 1.0 + (i as f64 * 0.7).sin()).collect();
        let vv = dot_f64(&v, &v);
        (0..d * d).map(|x| (x / d == x % d) as u8 as f64 - 2.0 * v[x / d] * v[x % d] / vv).collect()
    }

    #[test]
    fn principal_directions_find_known_eigenvectors() {
        // Samples sqrt(λ_k)·q_k make Σ x xᵀ = Σ λ_k q_k q_kᵀ: eigenvectors q_k, eigenvalues λ_k.
        let d = 12;
        let q = householder(d);
        let lambda: Vec<f64> = (0..d).map(|k| 100.0 * 0.6f64.powi(k as i32)).collect();
        let samples: Vec<f32> = (0..d).flat_map(|k| q[k * d..(k + 1) * d].iter().map(|&x| (lambda[k].sqrt() * x) as f32).collect::<Vec<_>>()).collect();
        let u = principal_directions(&samples, d, 3);
        assert_eq!(u.len(), 3 * d);
        for i in 0..3 {
            let ui = &u[i * d..(i + 1) * d];
            // Same direction as q_i, up to sign and the f32 rounding of the samples.
            let c = dot_f64(ui, &q[i * d..(i + 1) * d]).abs();
            assert!(c > 1.0 - 1e-6, "direction {i}: |cos| = {c}");
            for j in 0..3 {
                let g = dot_f64(ui, &u[j * d..(j + 1) * d]);
                assert!((g - (i == j) as u8 as f64).abs() < 1e-12, "u{i}·u{j} = {g}");
            }
        }
        // r > d is clamped to d, and still orthonormal.
        assert_eq!(principal_directions(&samples, d, 40).len(), d * d);
    }

    #[test]
    fn principal_directions_capture_what_naive_power_iteration_does() {
        // Oracle: one vector at a time, plain power iteration on M with the found ones deflated.
        let (d, n, r) = (20, 60, 4);
        let mut rng = fastrand::Rng::with_seed(7);
        let scale: Vec<f32> = (0..d).map(|i| 1.0 + 8.0 / (1.0 + i as f32)).collect();
        let samples: Vec<f32> = (0..n * d).map(|x| (rng.f32() - 0.3) * scale[x % d]).collect();
        let mut m = vec![0f64; d * d];
        for x in samples.chunks_exact(d) {
            for i in 0..d {
                for j in 0..d {
                    m[i * d + j] += x[i] as f64 * x[j] as f64;
                }
            }
        }
        let rayleigh = |u: &[f64]| dot_f64(u, &mul_rows(&m, u, d));
        let mut oracle: Vec<Vec<f64>> = Vec::new();
        for _ in 0..r {
            let mut v: Vec<f64> = (0..d).map(|i| 1.0 + i as f64).collect();
            for _ in 0..5000 {
                let mut w = mul_rows(&m, &v, d);
                for o in &oracle {
                    let p = dot_f64(&w, o);
                    w.iter_mut().zip(o).for_each(|(a, &b)| *a -= p * b);
                }
                let nw = dot_f64(&w, &w).sqrt();
                v = w.iter().map(|x| x / nw).collect();
            }
            oracle.push(v);
        }
        let u = principal_directions(&samples, d, r);
        for (i, o) in oracle.iter().enumerate() {
            let (ours, theirs) = (rayleigh(&u[i * d..(i + 1) * d]), rayleigh(o));
            assert!((ours - theirs).abs() <= 1e-9 * theirs, "eigenvalue {i}: {ours} vs oracle {theirs}");
            let c = dot_f64(&u[i * d..(i + 1) * d], o).abs();
            assert!(c > 1.0 - 1e-8, "direction {i}: |cos| with the oracle = {c}");
        }
    }

    #[test]
    fn projected_bound_is_an_upper_bound_and_tight_inside_the_directions() {
        let (d, rows, r) = (24, 50, 5);
        let mut rng = fastrand::Rng::with_seed(3);
        let w: Vec<f32> = (0..rows * d).map(|_| rng.f32() * 2.0 - 1.0).collect();
        let hs: Vec<f32> = (0..40 * d).map(|x| (rng.f32() - 0.5) * if x % d < 3 { 30.0 } else { 1.0 }).collect();
        let mut pb = ProjectedBound::new(principal_directions(&hs, d, r), d);
        pb.add_rows(&w[..20 * d]);
        pb.add_rows(&w[20 * d..]);
        assert_eq!((pb.len(), pb.dims()), (rows, r));
        for h in hs.chunks_exact(d) {
            let p = pb.project(h);
            for j in 0..rows {
                let x = exact_dot(&w[j * d..(j + 1) * d], h);
                assert!(pb.bound(j, &p) >= x, "row {j}: bound {} < exact {x}", pb.bound(j, &p));
            }
        }
        // A hidden state inside the directions: ρ ≈ 0 and the bound is the logit, up to γ‖b‖ and rounding.
        let h: Vec<f32> = pb.u[..d].iter().zip(&pb.u[d..2 * d]).map(|(a, b)| (3.0 * a - 2.0 * b) as f32).collect();
        let p = pb.project(&h);
        assert!(p.residual_norm() < 1e-6, "ρ = {}", p.residual_norm());
        for j in 0..rows {
            let x = exact_dot(&w[j * d..(j + 1) * d], &h);
            assert!(pb.bound(j, &p) - x < 1e-4, "row {j}: bound {} vs exact {x}", pb.bound(j, &p));
        }
    }

    #[test]
    fn certify_excludes_by_bound_rescoring_or_not_at_all() {
        let d = 4;
        // U = the first two axes; rows 0..3 and h chosen so every case happens.
        let u = vec![1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0];
        let mut pb = ProjectedBound::new(u, d);
        pb.add_rows(&[
            1.0, 0.0, 0.0, 0.0, // exact 5, bound 5
            0.0, 0.0, 1.0, 0.0, // exact 0, bound ‖r‖·ρ = 1·1 = 1
            0.0, 0.0, 4.0, 0.0, // exact 0, bound 4
            0.0, 0.0, 0.0, 4.0, // exact 4, bound 4
        ]);
        let h = [5.0, 0.0, 0.0, 1.0];
        let exact = |j: u32| [5.0, 0.0, 0.0, 4.0][j as usize];
        // top1 10: every bound is below 10 − 0.5.
        assert_eq!(certify(&pb, &[0, 1, 2, 3], &h, 10.0, 0.5, exact), Verdict { open: 0, certified: true });
        // top1 4: rows 2 and 3 are open (bound 4 ≥ 3.5); row 2's exact 0 + 0.5 < 4, row 3's 4 + 0.5 is not.
        assert_eq!(certify(&pb, &[1, 2], &h, 4.0, 0.5, exact), Verdict { open: 1, certified: true });
        assert_eq!(certify(&pb, &[1, 2, 3], &h, 4.0, 0.5, exact), Verdict { open: 2, certified: false });
        // An outside row within the slack of top1 is never certified away.
        assert!(!certify(&pb, &[3], &h, 4.4, 0.5, exact).certified);
        assert!(certify(&pb, &[3], &h, 4.6, 0.5, exact).certified);
    }
}
