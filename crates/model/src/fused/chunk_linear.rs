//! Chunked linear attention: the global part of FLASH's mixed chunk attention, forward and
//! backward, with the running sums of `K_linᵀ V` in one [s, e] buffer per sequence.

#[allow(unused_imports)]
use super::*;

/// Runs `f(b, item, threads)` for every batch element: in parallel across elements when there are
/// at least as many as threads, else one at a time with multi-threaded matrix products.
fn for_each_batch<T: Send>(items: Vec<T>, f: impl Fn(usize, T, Threads) + Sync) {
    if items.len() >= rayon::current_num_threads() {
        items
            .into_par_iter()
            .enumerate()
            .for_each(|(b, item)| f(b, item, Threads::PerBatch));
    } else {
        for (b, item) in items.into_iter().enumerate() {
            f(b, item, Threads::Within);
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
        }
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

    /// `sum += scale · Xᵀ Y` for chunk matrices X: [C, a] and Y: [C, w]; `sum`: [a, w].
    ///
    /// # Safety
    /// `x` and `y` point at C rows of widths `a` and `w`.
    unsafe fn add_xt_y(
        &self,
        sum: &mut [f32],
        (x, a): (*const f32, usize),
        (y, w): (*const f32, usize),
        scale: f32,
        par: Threads,
    ) {
        // SAFETY: forwarded from the caller; sum holds a × w.
        unsafe {
            matmul(
                (a, w, self.chunk),
                sum.as_mut_ptr(),
                w,
                true,
                (x, 1, a),
                (y, w, 1),
                scale,
                par.gemm(),
            );
        }
    }

    /// The summaries seen by each chunk, in chunk order: before chunk g (causal) or all (bidirectional).
    /// `each(g, summary)` is called with the [s, e] summary for chunk g.
    fn summaries(&self, b: usize, par: Threads, mut each: impl FnMut(usize, &[f32])) {
        let (c, s, e) = (self.chunk, self.s, self.e);
        let chunks = self.t / c;
        let mut kv = vec![0f32; s * e];
        if !self.causal {
            for g in 0..chunks {
                let (_, k, v) = self.chunk_ptrs(b, g);
                // SAFETY: chunk g of b has C rows of K_lin (width s) and V (width e).
                unsafe { self.add_xt_y(&mut kv, (k, s), (v, e), 1.0, par) };
            }
        }
        for g in 0..chunks {
            each(g, &kv);
            if self.causal {
                let (_, k, v) = self.chunk_ptrs(b, g);
                // SAFETY: as above.
                unsafe { self.add_xt_y(&mut kv, (k, s), (v, e), 1.0, par) };
            }
        }
    }
}

fn lin_forward(x: &LinInputs) -> Vec<f32> {
    let _timer = profile::Timer::start(profile::Part::Attention);
    let (c, s, e) = (x.chunk, x.s, x.e);
    let mut out = vec![0f32; x.n * x.t * e];
    let items: Vec<&mut [f32]> = out.chunks_mut(x.t * e).collect();
    for_each_batch(items, |b, out, par| {
        x.summaries(b, par, |g, kv| {
            let (q, _, _) = x.chunk_ptrs(b, g);
            // SAFETY: Q_lin chunk is C × s, kv is s × e, out's chunk g is C × e.
            unsafe {
                matmul(
                    (c, e, s),
                    out[g * c * e..].as_mut_ptr(),
                    e,
                    false,
                    (q, s, 1),
                    (kv.as_ptr(), e, 1),
                    x.factor,
                    par.gemm(),
                );
            }
        });
    });
    out
}

/// (dQ_lin, dK_lin, dV) of [`chunk_linear_attention`] for the upstream gradient [N, T, e].
fn lin_backward(x: &LinInputs, grad: &[f32]) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let _timer = profile::Timer::start(profile::Part::Attention);
    let (c, s, e, t) = (x.chunk, x.s, x.e, x.t);
    let chunks = t / c;
    let mut dq = vec![0f32; x.n * t * s];
    let mut dk = vec![0f32; x.n * t * s];
    let mut dv = vec![0f32; x.n * t * e];
    let items: Vec<_> = dq
        .chunks_mut(t * s)
        .zip(dk.chunks_mut(t * s))
        .zip(dv.chunks_mut(t * e))
        .collect();
    for_each_batch(items, |b, ((dq, dk), dv), par| {
        let dout = |g: usize| grad[(b * t + g * c) * e..].as_ptr();
        // dQ_g = f · dO_g · summary_gᵀ
        x.summaries(b, par, |g, kv| unsafe {
            // SAFETY: dO chunk C × e, kvᵀ e × s, dq chunk C × s.
            matmul(
                (c, s, e),
                dq[g * c * s..].as_mut_ptr(),
                s,
                false,
                (dout(g), e, 1),
                (kv.as_ptr(), 1, e),
                x.factor,
                par.gemm(),
            );
        });
        // D_g = f · Σ over the chunks that see chunk g of Q_lin,hᵀ dO_h; then dK_g = V_g D_gᵀ, dV_g = K_g D_g.
        let mut d = vec![0f32; s * e];
        if !x.causal {
            for h in 0..chunks {
                // SAFETY: Q_lin and dO chunks are C rows of widths s and e.
                unsafe {
                    x.add_xt_y(
                        &mut d,
                        (x.chunk_ptrs(b, h).0, s),
                        (dout(h), e),
                        x.factor,
                        par,
                    )
                };
            }
        }
        for g in (0..chunks).rev() {
            let (q, k, v) = x.chunk_ptrs(b, g);
            // SAFETY: V chunk C × e, Dᵀ e × s, dk chunk C × s; K chunk C × s, D s × e, dv chunk C × e.
            unsafe {
                matmul(
                    (c, s, e),
                    dk[g * c * s..].as_mut_ptr(),
                    s,
                    false,
                    (v, e, 1),
                    (d.as_ptr(), 1, e),
                    1.0,
                    par.gemm(),
                );
                matmul(
                    (c, e, s),
                    dv[g * c * e..].as_mut_ptr(),
                    e,
                    false,
                    (k, s, 1),
                    (d.as_ptr(), e, 1),
                    1.0,
                    par.gemm(),
                );
                if x.causal {
                    x.add_xt_y(&mut d, (q, s), (dout(g), e), x.factor, par);
                }
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
/// The backward recomputes the running sums instead of storing one per chunk.
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
            Some(Tensor::from_primitive::<Flex>(flex_from(
                lin_forward(&x),
                shape,
            )))
        }
        Route::Autodiff => {
            let p = |t: &Tensor<3>| t.clone().try_into_primitive::<Ad>().ok();
            let (q, k, vv) = (p(ql)?, p(kl)?, p(v)?);
            let x = LinInputs::new(
                q.primitive(),
                k.primitive(),
                vv.primitive(),
                chunk,
                factor,
                causal,
            );
            let output = flex_from(lin_forward(&x), vec![x.n, x.t, x.e]);
            let out = record(LinBackward, [q.node(), k.node(), vv.node()], x, output);
            Some(Tensor::from_primitive::<Ad>(out))
        }
    }
}
