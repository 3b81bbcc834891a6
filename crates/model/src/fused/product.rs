//! Dense matrix products through gemm, forward and both backward products.

#[allow(unused_imports)]
use super::*;

use super::activation::ELEMENTWISE_CHUNK;
use super::skinny;

/// How a product operand's buffer holds the [rows, cols] matrix it stands for.
#[derive(Clone, Copy)]
enum Stored {
    /// Row-major [rows, cols].
    AsIs,
    /// Row-major [cols, rows]: the operand is that buffer transposed, read through its strides.
    Transposed,
}

/// `A · B` for A [m, k] and B [k, n], each held as `Stored` says, multi-threaded: row-major [m, n].
fn product(
    (a, a_stored): (&[f32], Stored),
    (b, b_stored): (&[f32], Stored),
    (m, k, n): (usize, usize, usize),
) -> Vec<f32> {
    product_plus(None, (a, a_stored), (b, b_stored), (m, k, n))
}

/// `bias + A · B` (the bias [n] added to every row) or `A · B`: gemm accumulates the product onto
/// rows filled with the bias in parallel, instead of a separate single-threaded broadcast add.
fn product_plus(
    bias: Option<&[f32]>,
    (a, a_stored): (&[f32], Stored),
    (b, b_stored): (&[f32], Stored),
    (m, k, n): (usize, usize, usize),
) -> Vec<f32> {
    let _timer = profile::Timer::start(profile::Part::Products);
    assert_eq!((a.len(), b.len()), (m * k, k * n), "product operand sizes");
    // (row stride, column stride) of a [rows, cols] operand.
    let strides = |stored, rows: usize, cols: usize| match stored {
        Stored::AsIs => (cols, 1),
        Stored::Transposed => (1, rows),
    };
    let ((a_rs, a_cs), (b_rs, b_cs)) = (strides(a_stored, m, k), strides(b_stored, k, n));
    let mut c: Vec<f32> = Vec::with_capacity(m * n);
    // With a bias, gemm accumulates onto rows filled with it; without, gemm writes every element of
    // c without reading it (`accumulate` false), so c is not zeroed first: a memset of every
    // product's output (the [8192, 8192] logits among them) saved.
    let accumulate = match bias {
        Some(bias) => {
            assert_eq!(bias.len(), n, "product bias width");
            if n > 0 {
                c.spare_capacity_mut()[..m * n]
                    .par_chunks_mut(n * ELEMENTWISE_CHUNK.div_ceil(n))
                    .for_each(|rows| {
                        for r in rows.chunks_mut(n) {
                            for (d, &b) in r.iter_mut().zip(bias) {
                                d.write(b);
                            }
                        }
                    });
            }
            // SAFETY: the fill above wrote all m × n elements (m rows of the bias).
            unsafe { c.set_len(m * n) };
            true
        }
        None => false,
    };
    if k == 0 || m == 0 || n == 0 {
        return if accumulate { c } else { vec![0f32; m * n] };
    }
    // A few rows against a matrix read once (a decoding step's projections): B read in place
    // instead of packed by gemm (`skinny`).
    let level = super::simd::current();
    if matches!((a_stored, b_stored), (Stored::AsIs, Stored::AsIs)) && skinny::takes(level, m) {
        if !accumulate {
            c.resize(m * n, 0.0);
        }
        if skinny::skinny_product_acc(level, &mut c, a, b, (m, k, n)) {
            return c;
        }
    }
    // SAFETY: a holds m × k and b k × n elements (checked), which either layout's strides stay
    // inside; c has capacity m × n, row-major: with `accumulate` all m × n elements are already
    // initialised and read, without it gemm has written all of them (m, n, k > 0, dst not read)
    // when the length is set.
    unsafe {
        matmul(
            (m, n, k),
            c.as_mut_ptr(),
            n,
            accumulate,
            (a.as_ptr(), a_rs, a_cs),
            (b.as_ptr(), b_rs, b_cs),
            1.0,
            Parallelism::Rayon(0),
        );
        c.set_len(m * n);
    }
    c
}

/// Column sums of a row-major [m, n] matrix (the bias gradient of `bias + A · B`), rows summed in
/// parallel blocks whose partial sums are then added in order (reproducible, see `sum_in_order`).
fn column_sums(g: &[f32], n: usize) -> Vec<f32> {
    if n == 0 {
        return Vec::new();
    }
    let _timer = profile::Timer::start(profile::Part::Products);
    let level = simd::current();
    let partials = g
        .par_chunks(n * ELEMENTWISE_CHUNK.div_ceil(n))
        .map(|rows| {
            level.run(
                #[inline(always)]
                || {
                    let mut s = vec![0f32; n];
                    for r in rows.chunks(n) {
                        for (s, &x) in s.iter_mut().zip(r) {
                            *s += x;
                        }
                    }
                    s
                },
            )
        })
        .collect::<Vec<_>>();
    sum_in_order(partials, n)
}

#[derive(Clone)]
struct ProductSaved {
    a: FlexTensor,
    b: FlexTensor,
}

impl fmt::Debug for ProductSaved {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ProductSaved({:?} · {:?})", dims(&self.a), dims(&self.b))
    }
}

#[derive(Debug)]
struct ProductBackward;

/// Parents: A, B and, for [`affine_2d`], the bias.
impl<const P: usize> Backward<Flex, P> for ProductBackward {
    type State = ProductSaved;

    fn backward(self, ops: Ops<Self::State, P>, grads: &mut Gradients, _: &mut Checkpointer) {
        let ProductSaved { a, b } = ops.state;
        let grad = contiguous(&grads.consume::<Flex>(&ops.node));
        let (m, k, n) = (dims(&a)[0], dims(&a)[1], dims(&b)[1]);
        let (a, b, g) = (slice(&a), slice(&b), slice(&grad));
        let node = |i: usize| ops.parents.get(i).and_then(|p| p.as_ref());
        if let Some(node) = node(0) {
            // dA = dC · Bᵀ: [m, n] · [n, k].
            let da = product((g, Stored::AsIs), (b, Stored::Transposed), (m, n, k));
            grads.register::<Flex>(node.id, flex_from(da, vec![m, k]));
        }
        if let Some(node) = node(1) {
            // dB = Aᵀ · dC: [k, m] · [m, n].
            let db = product((a, Stored::Transposed), (g, Stored::AsIs), (k, m, n));
            grads.register::<Flex>(node.id, flex_from(db, vec![k, n]));
        }
        if let Some(node) = node(2) {
            // dbias = Σ over rows of dC.
            grads.register::<Flex>(node.id, flex_from(column_sums(g, n), vec![n]));
        }
    }
}

/// `A · B` for A [m, k] and B [k, n] → [m, n], with gemm called directly on `flex` (forward and
/// both backward products), burn's `matmul` elsewhere.
///
/// flex's own `matmul` reaches about 60 GFLOP/s on the shapes of the models' dense layers
/// ([8192, 256] · [256, 1364], forward + backward) where the same gemm calls reach about 200:
/// every projection, feed-forward layer and the LM head goes through here.
pub fn matmul_2d(a: Tensor<2>, b: Tensor<2>) -> Tensor<2> {
    product_2d(a, b, None)
}

/// `A · B + bias` for A [m, k], B [k, n] and bias [n] → [m, n]: a linear layer. On `flex` the bias
/// fills the output rows and gemm accumulates the product onto them, and the bias's gradient is a
/// parallel column sum; burn's broadcast add and its backward (single-threaded) elsewhere.
pub fn affine_2d(a: Tensor<2>, b: Tensor<2>, bias: Tensor<1>) -> Tensor<2> {
    product_2d(a, b, Some(bias))
}

/// [`matmul_2d`] and [`affine_2d`]: `A · B (+ bias)` routed to the fused product or burn's own.
fn product_2d(a: Tensor<2>, b: Tensor<2>, bias: Option<Tensor<1>>) -> Tensor<2> {
    let ([m, k], [k2, n]) = (a.dims(), b.dims());
    assert_eq!(k, k2, "matmul_2d: [{m}, {k}] · [{k2}, {n}]");
    if let Some(bias) = &bias {
        let [n2] = bias.dims();
        assert_eq!(n, n2, "affine_2d: bias [{n2}] for {n} columns");
    }
    let reference = |a: Tensor<2>, b: Tensor<2>, bias: Option<Tensor<1>>| match bias {
        Some(bias) => a.matmul(b) + bias.unsqueeze(),
        None => a.matmul(b),
    };
    let host_bias = bias.as_ref().map(host_vec);
    let forward = |pa: &FlexTensor, pb: &FlexTensor| {
        let c = product_plus(
            host_bias.as_deref(),
            (slice(pa), Stored::AsIs),
            (slice(pb), Stored::AsIs),
            (m, k, n),
        );
        flex_from(c, vec![m, n])
    };
    match route(&a.device()) {
        Route::Reference => reference(a, b, bias),
        Route::Plain => {
            let (Ok(pa), Ok(pb)) = (
                a.clone().try_into_primitive::<Flex>(),
                b.clone().try_into_primitive::<Flex>(),
            ) else {
                return reference(a, b, bias);
            };
            let (pa, pb) = (contiguous(&pa), contiguous(&pb));
            Tensor::from_primitive::<Flex>(forward(&pa, &pb))
        }
        Route::Autodiff => {
            let ta = a.clone().try_into_primitive::<Ad>();
            let tb = b.clone().try_into_primitive::<Ad>();
            let tbias = bias
                .clone()
                .map(|t| t.try_into_primitive::<Ad>())
                .transpose();
            let (Ok(ta), Ok(tb), Ok(tbias)) = (ta, tb, tbias) else {
                return reference(a, b, bias);
            };
            let (pa, pb) = (contiguous(ta.primitive()), contiguous(tb.primitive()));
            let output = forward(&pa, &pb);
            let saved = ProductSaved { a: pa, b: pb };
            let out = match tbias {
                Some(tbias) => record(
                    ProductBackward,
                    [ta.node(), tb.node(), tbias.node()],
                    saved,
                    output,
                ),
                None => record(ProductBackward, [ta.node(), tb.node()], saved, output),
            };
            Tensor::from_primitive::<Ad>(out)
        }
    }
}
