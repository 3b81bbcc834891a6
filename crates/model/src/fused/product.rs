//! Dense matrix products through gemm, forward and both backward products.

#[allow(unused_imports)]
use super::*;

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
    let _timer = profile::Timer::start(profile::Part::Products);
    assert_eq!((a.len(), b.len()), (m * k, k * n), "product operand sizes");
    // (row stride, column stride) of a [rows, cols] operand.
    let strides = |stored, rows: usize, cols: usize| match stored {
        Stored::AsIs => (cols, 1),
        Stored::Transposed => (1, rows),
    };
    let ((a_rs, a_cs), (b_rs, b_cs)) = (strides(a_stored, m, k), strides(b_stored, k, n));
    if k == 0 || m == 0 || n == 0 {
        return vec![0f32; m * n];
    }
    // gemm writes every element of c without reading it (`accumulate` false), so c is not zeroed
    // first: a memset of every product's output (the [8192, 8192] logits among them) saved.
    let mut c = Vec::with_capacity(m * n);
    // SAFETY: a holds m × k and b k × n elements (checked), which either layout's strides stay
    // inside; c has capacity m × n, row-major, and gemm has written all m × n elements (m, n, k
    // > 0, dst not read) when its length is set.
    unsafe {
        matmul(
            (m, n, k),
            c.as_mut_ptr(),
            n,
            false,
            (a.as_ptr(), a_rs, a_cs),
            (b.as_ptr(), b_rs, b_cs),
            1.0,
            Parallelism::Rayon(0),
        );
        c.set_len(m * n);
    }
    c
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

impl Backward<Flex, 2> for ProductBackward {
    type State = ProductSaved;

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let ProductSaved { a, b } = ops.state;
        let grad = contiguous(&grads.consume::<Flex>(&ops.node));
        let (m, k, n) = (dims(&a)[0], dims(&a)[1], dims(&b)[1]);
        let (a, b, g) = (slice(&a), slice(&b), slice(&grad));
        let [a_node, b_node] = &ops.parents;
        if let Some(node) = a_node {
            // dA = dC · Bᵀ: [m, n] · [n, k].
            let da = product((g, Stored::AsIs), (b, Stored::Transposed), (m, n, k));
            grads.register::<Flex>(node.id, flex_from(da, vec![m, k]));
        }
        if let Some(node) = b_node {
            // dB = Aᵀ · dC: [k, m] · [m, n].
            let db = product((a, Stored::Transposed), (g, Stored::AsIs), (k, m, n));
            grads.register::<Flex>(node.id, flex_from(db, vec![k, n]));
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
    let ([m, k], [k2, n]) = (a.dims(), b.dims());
    assert_eq!(k, k2, "matmul_2d: [{m}, {k}] · [{k2}, {n}]");
    match route(&a.device()) {
        Route::Reference => a.matmul(b),
        Route::Plain => {
            let (Ok(pa), Ok(pb)) = (
                a.clone().try_into_primitive::<Flex>(),
                b.clone().try_into_primitive::<Flex>(),
            ) else {
                return a.matmul(b);
            };
            let (pa, pb) = (contiguous(&pa), contiguous(&pb));
            let c = product(
                (slice(&pa), Stored::AsIs),
                (slice(&pb), Stored::AsIs),
                (m, k, n),
            );
            Tensor::from_primitive::<Flex>(flex_from(c, vec![m, n]))
        }
        Route::Autodiff => {
            let (Ok(ta), Ok(tb)) = (
                a.clone().try_into_primitive::<Ad>(),
                b.clone().try_into_primitive::<Ad>(),
            ) else {
                return a.matmul(b);
            };
            let (pa, pb) = (contiguous(ta.primitive()), contiguous(tb.primitive()));
            let c = product(
                (slice(&pa), Stored::AsIs),
                (slice(&pb), Stored::AsIs),
                (m, k, n),
            );
            let out = record(
                ProductBackward,
                [ta.node(), tb.node()],
                ProductSaved { a: pa, b: pb },
                flex_from(c, vec![m, n]),
            );
            Tensor::from_primitive::<Ad>(out)
        }
    }
}
