//! Cross-entropy per row, `logsumexp(x) − x[target]`, one pass forward and one backward.

#[allow(unused_imports)]
use super::*;

/// Per-row `logsumexp(x) − x[target]` and the log-sum-exps.
fn ce_forward(logits: &[f32], v: usize, targets: &[i64]) -> (Vec<f32>, Vec<f32>) {
    let _timer = profile::Timer::start(profile::Part::CrossEntropy);
    let level = simd::current();
    let rows: Vec<(f32, f32)> = logits
        .par_chunks(v)
        .zip(targets.par_iter())
        .map(|(row, &t)| {
            level.run(
                #[inline(always)]
                || {
                    let lse = log_sum_exp(row);
                    (lse - row[t as usize], lse)
                },
            )
        })
        .collect();
    rows.into_iter().unzip()
}

/// `log Σ exp(row)`, the row maximum subtracted first; inline, for kernels' SIMD closures.
#[inline(always)]
pub(super) fn log_sum_exp(row: &[f32]) -> f32 {
    let m = simd::max(row);
    m + simd::sum_map(row, |x| fast_exp(x - m)).ln()
}

/// The targets on the host, each checked to be a word of a `v`-word vocabulary (`None` if they
/// are not integers burn can convert).
pub(super) fn host_targets(targets: &Tensor<1, Int>, v: usize) -> Option<Vec<i64>> {
    let targets: Vec<i64> = targets
        .clone()
        .into_data()
        .convert::<i64>()
        .try_into_vec::<i64>()
        .ok()?;
    if let Some(bad) = targets.iter().find(|&&t| t < 0 || t as usize >= v) {
        panic!("cross-entropy target {bad} outside the vocabulary 0..{v}");
    }
    Some(targets)
}

#[derive(Clone)]
struct CeSaved {
    logits: FlexTensor,
    lse: Arc<Vec<f32>>,
    targets: Arc<Vec<i64>>,
}

impl fmt::Debug for CeSaved {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CeSaved({} rows)", self.targets.len())
    }
}

#[derive(Debug)]
struct CeBackward;

impl Backward<Flex, 1> for CeBackward {
    type State = CeSaved;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let _timer = profile::Timer::start(profile::Part::CrossEntropy);
        let saved = ops.state;
        let grad = contiguous(&grads.consume::<Flex>(&ops.node));
        let Some(node) = &ops.parents[0] else {
            return;
        };
        let g = slice(&grad);
        let logits = slice(&saved.logits);
        let n = saved.targets.len();
        let v = logits.len() / n.max(1);
        let mut out = zeros(logits.len());
        let level = simd::current();
        out.par_chunks_mut(v)
            .zip(logits.par_chunks(v))
            .enumerate()
            .for_each(|(r, (o, x))| {
                let (l, gr) = (saved.lse[r], g[r]);
                level.run(
                    #[inline(always)]
                    || {
                        for (o, &x) in o.iter_mut().zip(x) {
                            *o = gr * fast_exp(x - l);
                        }
                    },
                );
                o[saved.targets[r] as usize] -= gr;
            });
        grads.register::<Flex>(node.id, flex_from(out, vec![n, v]));
    }
}

/// Per-row cross-entropy `−log softmax(logits)[target]` fused (see the module doc), or `None` off
/// `flex`. logits: [N, V]; targets: [N] in `0..V` → [N].
pub fn cross_entropy_rows(logits: &Tensor<2>, targets: &Tensor<1, Int>) -> Option<Tensor<1>> {
    let route = route(&logits.device());
    if route == Route::Reference {
        return None;
    }
    let [n, v] = logits.dims();
    let targets = host_targets(targets, v)?;
    match route {
        Route::Plain => {
            let x = contiguous(&logits.clone().try_into_primitive::<Flex>().ok()?);
            let (loss, _) = ce_forward(slice(&x), v, &targets);
            Some(Tensor::from_primitive::<Flex>(flex_from(loss, vec![n])))
        }
        Route::Autodiff => {
            let x = logits.clone().try_into_primitive::<Ad>().ok()?;
            let prim = contiguous(x.primitive());
            let (loss, lse) = ce_forward(slice(&prim), v, &targets);
            let output = flex_from(loss, vec![n]);
            let out = record(
                CeBackward,
                [x.node()],
                CeSaved {
                    logits: prim,
                    lse: Arc::new(lse),
                    targets: Arc::new(targets),
                },
                output,
            );
            Some(Tensor::from_primitive::<Ad>(out))
        }
        Route::Reference => None,
    }
}
