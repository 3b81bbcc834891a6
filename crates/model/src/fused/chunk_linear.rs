//! Chunked linear attention: the global part of FLASH's mixed chunk attention, forward and
//! backward. Every chunk's products run in parallel over (sequence, chunk) — each chunk's
//! `K_linᵀ V` term, then the running sums over chunks in chunk order, then each chunk's product
//! with the sum it sees — so that one long sequence (table11's 8192 tokens) uses every thread
//! with single-threaded products. Causal attention skips the products known to be zero: the first
//! chunk sees nothing and the last chunk's term is seen by none.

#[allow(unused_imports)]
use super::*;

/// Runs `f(i, item, threads)` for every item: in parallel across items when there are at least as
/// many as threads, else one at a time with multi-threaded matrix products.
fn for_each_item<T: Send>(items: Vec<T>, f: impl Fn(usize, T, Threads) + Sync) {
    if items.len() >= rayon::current_num_threads() {
        items
            .into_par_iter()
            .enumerate()
            .for_each(|(i, item)| f(i, item, Threads::PerBatch));
    } else {
        for (i, item) in items.into_iter().enumerate() {
            f(i, item, Threads::Within);
        }
    }
}

/// Inputs of [`chunk_linear_attention`] as contiguous flex tensors.
#[derive(Clone)]
struct LinInputs {
    ql: FlexTensor,
    kl: FlexTensor,
    v: FlexTensor,
    chunk: usize,
    factor: f32,
    causal: bool,
    /// (N, T, s, e)
    n: usize,
    t: usize,
    s: usize,
    e: usize,
    /// The summaries the forward multiplied each chunk's queries by, kept for the backward's dQ
    /// (see [`LinInputs::keeps_summaries`]): per batch element, one [s, e] per chunk (causal,
    /// chunk 0's all zero) or one in all (bidirectional). Empty: the backward recomputes them.
    kept: Arc<Vec<f32>>,
}

impl fmt::Debug for LinInputs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LinInputs(chunk {}, causal {})", self.chunk, self.causal)
    }
}

impl LinInputs {
    fn new(
        ql: &FlexTensor,
        kl: &FlexTensor,
        v: &FlexTensor,
        chunk: usize,
        factor: f32,
        causal: bool,
    ) -> Self {
        let (qd, vd) = (dims(ql), dims(v));
        let [n, t, s] = [qd[0], qd[1], qd[2]];
        assert_eq!(dims(kl), qd, "chunk linear attention: K_lin shape");
        assert_eq!((vd[0], vd[1]), (n, t), "chunk linear attention: V shape");
        assert!(
            chunk > 0 && t.is_multiple_of(chunk),
            "chunk linear attention: length {t} is not a multiple of the chunk {chunk}"
        );
        Self {
            ql: contiguous(ql),
            kl: contiguous(kl),
            v: contiguous(v),
            chunk,
            factor,
            causal,
            n,
            t,
            s,
            e: vd[2],
            kept: Arc::new(Vec::new()),
        }
    }

    /// Whether a forward recorded for autodiff keeps its summaries for the backward, which then
    /// skips recomputing them (one `K_linᵀ V` product per chunk): when they fit in
    /// [`kept_scores_limit`] bytes, the knob that bounds what the attention kernels keep. They are
    /// small beside the activations autodiff keeps anyway: `s·e` floats per chunk of C positions,
    /// against the `C·e` of V's own chunk (s = 128 < C = 256 in the paper).
    fn keeps_summaries(&self) -> bool {
        let per_seq = if self.causal { self.chunks() } else { 1 };
        let floats = self.n * per_seq * self.s * self.e;
        floats * std::mem::size_of::<f32>() <= super::kept_scores_limit()
    }

    /// Pointers to chunk `g` of batch element `b`: (Q_lin, K_lin, V).
    fn chunk_ptrs(&self, b: usize, g: usize) -> (*const f32, *const f32, *const f32) {
        let row = b * self.t + g * self.chunk;
        (
            slice(&self.ql)[row * self.s..].as_ptr(),
            slice(&self.kl)[row * self.s..].as_ptr(),
            slice(&self.v)[row * self.e..].as_ptr(),
        )
    }

    /// `dst = scale · Xᵀ Y` for chunk matrices X: [C, a] and Y: [C, w]; `dst`: [a, w].
    ///
    /// # Safety
    /// `x` and `y` point at C rows of widths `a` and `w`.
    unsafe fn xt_y(
        &self,
        dst: &mut [f32],
        (x, a): (*const f32, usize),
        (y, w): (*const f32, usize),
        scale: f32,
        par: Threads,
    ) {
        // SAFETY: forwarded from the caller; dst holds a × w.
        unsafe {
            matmul(
                (a, w, self.chunk),
                dst.as_mut_ptr(),
                w,
                false,
                (x, 1, a),
                (y, w, 1),
                scale,
                par.gemm(),
            );
        }
    }

    /// Chunks per sequence.
    fn chunks(&self) -> usize {
        self.t / self.chunk
    }

    /// Whether chunk g's summary is all zero: the first chunk of a causal sequence sees nothing,
    /// so its output (and its dQ) is zero and the products with that summary are skipped.
    fn sees_nothing(&self, g: usize) -> bool {
        self.causal && g == 0
    }

    /// Whether chunk g's own term reaches no chunk: the last of a causal sequence.
    fn seen_by_none(&self, g: usize) -> bool {
        self.causal && g + 1 == self.chunks()
    }

    /// The summaries the chunks see, [`LinInputs::kept`]'s layout: each chunk's `K_linᵀ V` term
    /// (one product per chunk, the chunks of every sequence in parallel), then per sequence their
    /// exclusive prefix sums in chunk order (causal) or their sum (bidirectional).
    fn summaries(&self) -> Vec<f32> {
        let (s, e) = (self.s, self.e);
        let mut terms = zeros(self.n * self.chunks() * s * e);
        let items: Vec<&mut [f32]> = terms.chunks_mut(s * e).collect();
        for_each_item(items, |i, term, par| {
            let (b, g) = (i / self.chunks(), i % self.chunks());
            if self.seen_by_none(g) {
                return;
            }
            let (_, k, v) = self.chunk_ptrs(b, g);
            // SAFETY: chunk g of b has C rows of K_lin (width s) and V (width e).
            unsafe { self.xt_y(term, (k, s), (v, e), 1.0, par) };
        });
        chunk_sums(
            terms,
            self.n,
            self.chunks(),
            s * e,
            Sum::exclusive(self.causal),
        )
    }
}

/// Which running sum of per-chunk terms [`chunk_sums`] makes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Sum {
    /// Chunk g gets Σ over h < g (causal summaries).
    Before,
    /// Chunk g gets Σ over h > g (causal backward: the chunks that see g).
    After,
    /// One sum over every chunk (bidirectional).
    All,
}

impl Sum {
    /// The summaries' sum: `Before` for causal attention, else `All`.
    fn exclusive(causal: bool) -> Self {
        if causal { Sum::Before } else { Sum::All }
    }
}

/// Running sums over chunks of `terms` ([N, G, len]), per sequence, in chunk order (the same
/// additions whatever the thread count): [N, G, len] for `Before`/`After`, [N, 1, len] for `All`.
fn chunk_sums(mut terms: Vec<f32>, n: usize, chunks: usize, len: usize, sum: Sum) -> Vec<f32> {
    // Columns of each sequence's terms in blocks, so that short sequences still use every thread.
    const COLUMNS: usize = 4096;
    let per_seq = chunks * len;
    let blocks: Vec<(usize, usize)> = (0..n)
        .flat_map(|b| (0..len).step_by(COLUMNS).map(move |c0| (b, c0)))
        .collect();
    let base = SendPtr(terms.as_mut_ptr());
    blocks.into_par_iter().for_each(|(b, c0)| {
        let cols = COLUMNS.min(len - c0);
        let base = &base;
        // SAFETY: each (b, c0) block touches only columns c0..c0 + cols of sequence b's chunks,
        // disjoint from every other block's, all inside `terms`.
        let at = |g: usize| unsafe {
            std::slice::from_raw_parts_mut(base.0.add(b * per_seq + g * len + c0), cols)
        };
        let mut acc = vec![0f32; cols];
        let order: Box<dyn Iterator<Item = usize>> = match sum {
            Sum::Before | Sum::All => Box::new(0..chunks),
            Sum::After => Box::new((0..chunks).rev()),
        };
        for g in order {
            let term = at(g);
            if sum == Sum::All {
                for (a, t) in acc.iter_mut().zip(term.iter()) {
                    *a += t;
                }
            } else {
                for (a, t) in acc.iter_mut().zip(term.iter_mut()) {
                    let next = *a + *t;
                    *t = *a;
                    *a = next;
                }
            }
        }
        if sum == Sum::All {
            at(0).copy_from_slice(&acc);
        }
    });
    if sum == Sum::All {
        // Keep each sequence's first chunk (its sum): [N, 1, len].
        for b in 1..n {
            terms.copy_within(b * per_seq..b * per_seq + len, b * len);
        }
        terms.truncate(n * len);
    }
    terms
}

/// A raw pointer shared across the threads of [`chunk_sums`], each writing its own columns.
struct SendPtr(*mut f32);
// SAFETY: only used for disjoint writes (see chunk_sums).
unsafe impl Sync for SendPtr {}
unsafe impl Send for SendPtr {}

/// The summary chunk g of sequence b sees, from [`LinInputs::summaries`]'s output.
fn summary_of<'a>(x: &LinInputs, summaries: &'a [f32], b: usize, g: usize) -> &'a [f32] {
    let se = x.s * x.e;
    let i = if x.causal { b * x.chunks() + g } else { b };
    &summaries[i * se..(i + 1) * se]
}

/// The forward's output [N, T, e] and the summaries it used (see [`LinInputs::kept`]).
fn lin_forward(x: &LinInputs) -> (Vec<f32>, Vec<f32>) {
    let _timer = profile::Timer::start(profile::Part::Attention);
    let (c, s, e) = (x.chunk, x.s, x.e);
    let summaries = x.summaries();
    let mut out = zeros(x.n * x.t * e);
    let items: Vec<&mut [f32]> = out.chunks_mut(c * e).collect();
    for_each_item(items, |i, out, par| {
        let (b, g) = (i / x.chunks(), i % x.chunks());
        if x.sees_nothing(g) {
            return; // the chunk's output stays zero
        }
        let (q, _, _) = x.chunk_ptrs(b, g);
        let kv = summary_of(x, &summaries, b, g);
        // SAFETY: Q_lin chunk is C × s, kv is s × e, out's chunk is C × e.
        unsafe {
            matmul(
                (c, e, s),
                out.as_mut_ptr(),
                e,
                false,
                (q, s, 1),
                (kv.as_ptr(), e, 1),
                x.factor,
                par.gemm(),
            );
        }
    });
    (out, summaries)
}

/// (dQ_lin, dK_lin, dV) of [`chunk_linear_attention`] for the upstream gradient [N, T, e].
fn lin_backward(x: &LinInputs, grad: &[f32]) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let _timer = profile::Timer::start(profile::Part::Attention);
    let (c, s, e, t) = (x.chunk, x.s, x.e, x.t);
    let recomputed;
    let summaries: &[f32] = if x.kept.is_empty() {
        recomputed = x.summaries();
        &recomputed
    } else {
        &x.kept
    };
    let dout = |b: usize, g: usize| grad[(b * t + g * c) * e..].as_ptr();
    // D_g = f · Σ over the chunks h that see chunk g of Q_lin,hᵀ dO_h: per-chunk terms, then
    // their sums after g (causal) or over all (bidirectional).
    let mut terms = zeros(x.n * x.chunks() * s * e);
    let items: Vec<&mut [f32]> = terms.chunks_mut(s * e).collect();
    for_each_item(items, |i, term, par| {
        let (b, g) = (i / x.chunks(), i % x.chunks());
        if x.sees_nothing(g) {
            return; // chunk 0 sees no chunk, so its term reaches none
        }
        // SAFETY: Q_lin and dO chunks are C rows of widths s and e.
        unsafe {
            x.xt_y(
                term,
                (x.chunk_ptrs(b, g).0, s),
                (dout(b, g), e),
                x.factor,
                par,
            )
        };
    });
    let sum = if x.causal { Sum::After } else { Sum::All };
    let d_sums = chunk_sums(terms, x.n, x.chunks(), s * e, sum);
    let mut dq = zeros(x.n * t * s);
    let mut dk = zeros(x.n * t * s);
    let mut dv = zeros(x.n * t * e);
    let items: Vec<_> = dq
        .chunks_mut(c * s)
        .zip(dk.chunks_mut(c * s))
        .zip(dv.chunks_mut(c * e))
        .collect();
    // The [s, e] right operands of dQ and dK are transposed first, so that gemm reads them
    // n-contiguous (see `transpose_into`: 80 against 113 GFLOP/s for these shapes on one thread).
    for_each_item(items, |i, ((dq, dk), dv), par| {
        let (b, g) = (i / x.chunks(), i % x.chunks());
        let (_, k, v) = x.chunk_ptrs(b, g);
        let mut transposed = Vec::new();
        // SAFETY (all three): dO chunk C × e, summaryᵀ e × s, dq chunk C × s; V chunk C × e,
        // Dᵀ e × s, dk chunk C × s; K chunk C × s, D s × e, dv chunk C × e.
        if !x.sees_nothing(g) {
            // dQ_g = f · dO_g · summary_gᵀ
            transpose_into(summary_of(x, summaries, b, g), (s, e), &mut transposed, par);
            unsafe {
                matmul(
                    (c, s, e),
                    dq.as_mut_ptr(),
                    s,
                    false,
                    (dout(b, g), e, 1),
                    (transposed.as_ptr(), s, 1),
                    x.factor,
                    par.gemm(),
                )
            };
        }
        if !x.seen_by_none(g) {
            // dK_g = V_g D_gᵀ, dV_g = K_g D_g
            let d = summary_of(x, &d_sums, b, g);
            transpose_into(d, (s, e), &mut transposed, par);
            unsafe {
                matmul(
                    (c, s, e),
                    dk.as_mut_ptr(),
                    s,
                    false,
                    (v, e, 1),
                    (transposed.as_ptr(), s, 1),
                    1.0,
                    par.gemm(),
                );
                matmul(
                    (c, e, s),
                    dv.as_mut_ptr(),
                    e,
                    false,
                    (k, s, 1),
                    (d.as_ptr(), e, 1),
                    1.0,
                    par.gemm(),
                );
            }
        }
    });
    (dq, dk, dv)
}

#[derive(Debug)]
struct LinBackward;

impl Backward<Flex, 3> for LinBackward {
    type State = LinInputs;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let x = ops.state;
        let grad = contiguous(&grads.consume::<Flex>(&ops.node));
        let (dq, dk, dv) = lin_backward(&x, slice(&grad));
        let results = [
            (Some(dq), vec![x.n, x.t, x.s]),
            (Some(dk), vec![x.n, x.t, x.s]),
            (Some(dv), vec![x.n, x.t, x.e]),
        ];
        let parents = ops.parents.iter().map(|p| p.as_ref().map(|n| n.id));
        register_grads(grads, parents, results);
    }
}

/// The global part of FLASH's mixed chunk attention fused, or `None` off `flex`:
/// `out_g = f · Q_lin,g · Σ_h K_lin,hᵀ V_h` over chunks h < g (causal) or all h (bidirectional).
/// The forward keeps the running sum each chunk saw for the backward (up to
/// [`kept_scores_limit`](super::kept_scores_limit) bytes, else the backward recomputes them).
///
/// ql, kl: [N, T, s]; v: [N, T, e], T a multiple of `chunk` → [N, T, e].
pub fn chunk_linear_attention(
    ql: &Tensor<3>,
    kl: &Tensor<3>,
    v: &Tensor<3>,
    chunk: usize,
    factor: f32,
    causal: bool,
) -> Option<Tensor<3>> {
    match route(&ql.device()) {
        Route::Reference => None,
        Route::Plain => {
            let p = |t: &Tensor<3>| t.clone().try_into_primitive::<Flex>().ok();
            let x = LinInputs::new(&p(ql)?, &p(kl)?, &p(v)?, chunk, factor, causal);
            let shape = vec![x.n, x.t, x.e];
            let (out, _) = lin_forward(&x);
            Some(Tensor::from_primitive::<Flex>(flex_from(out, shape)))
        }
        Route::Autodiff => {
            let p = |t: &Tensor<3>| t.clone().try_into_primitive::<Ad>().ok();
            let (q, k, vv) = (p(ql)?, p(kl)?, p(v)?);
            let mut x = LinInputs::new(
                q.primitive(),
                k.primitive(),
                vv.primitive(),
                chunk,
                factor,
                causal,
            );
            let (out, summaries) = lin_forward(&x);
            if x.keeps_summaries() {
                x.kept = Arc::new(summaries);
            }
            let output = flex_from(out, vec![x.n, x.t, x.e]);
            let out = record(LinBackward, [q.node(), k.node(), vv.node()], x, output);
            Some(Tensor::from_primitive::<Ad>(out))
        }
    }
}
