//! Dropout with a hashed mask (T5's fine-tuning: dropout 0.1 on the embeddings, the residual
//! branches, the feed-forward's hidden layer and the attention weights): which elements are kept
//! is a hash of a seed and the element's index ([`DropoutMask`]), so a backward pass regenerates
//! its forward's mask instead of storing it, and an activation's dropout is one pass each way.
//! burn's `Dropout` draws a Bernoulli tensor from its ChaCha generator and records three ops.

#[allow(unused_imports)]
use super::*;

use super::activation::ELEMENTWISE_CHUNK;

/// A dropout mask over elements indexed (n, i, j): each kept with probability 1 − `prob` and
/// scaled by 1 / (1 − `prob`), or zeroed, by a hash of (`seed`, n, i, j), so that a backward pass
/// regenerates its forward's mask instead of storing it; the caller draws a new seed per call from
/// its generator. The attention kernel indexes its weights (query element, query row, key)
/// ([`attention_grouped_dropout`](super::attention_grouped_dropout)); [`dropout`] an activation's
/// elements (row of the last dimension, 0, column).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DropoutMask {
    /// The probability of zeroing a weight, in (0, 1).
    pub prob: f32,
    /// Selects the mask.
    pub seed: u64,
}

impl DropoutMask {
    /// Dropout of `prob` ∈ (0, 1) with the mask `seed` selects.
    ///
    /// Panics if `prob` is outside (0, 1).
    pub fn new(prob: f32, seed: u64) -> Self {
        assert!(
            prob > 0.0 && prob < 1.0,
            "dropout probability {prob} is not in (0, 1)"
        );
        Self { prob, seed }
    }

    /// A weight is kept when its 32-bit hash is below this: (1 − prob) · 2³².
    fn threshold(self) -> u32 {
        ((1.0 - self.prob as f64) * 4_294_967_296.0).min(u32::MAX as f64) as u32
    }

    /// Row (n, i)'s key, from which each key j's hash follows.
    fn row_key(self, (n, i): (usize, usize)) -> u32 {
        (splitmix64(self.seed ^ splitmix64(((n as u64) << 32) ^ i as u64)) >> 32) as u32
    }

    /// Whether weight (n, i, j) is kept.
    pub fn keeps(self, n: usize, i: usize, j: usize) -> bool {
        key_hash(self.row_key((n, i)), j) < self.threshold()
    }

    /// Row (n, i)'s dropout: `(j, x)` ↦ x · 1 / (1 − prob) if element j is kept, else 0.
    #[inline(always)]
    fn row(self, row: (usize, usize)) -> impl Fn(usize, f32) -> f32 {
        let (key, threshold, scale) =
            (self.row_key(row), self.threshold(), 1.0 / (1.0 - self.prob));
        move |j, x| {
            if key_hash(key, j) < threshold {
                x * scale
            } else {
                0.0
            }
        }
    }

    /// `dst[j] = src[j] · (kept ? 1 / (1 − prob) : 0)` along row (n, i).
    #[inline(always)]
    pub(super) fn apply(self, row: (usize, usize), src: &[f32], dst: &mut [f32]) {
        let drop = self.row(row);
        for (j, (d, &x)) in dst.iter_mut().zip(src).enumerate() {
            *d = drop(j, x);
        }
    }

    /// [`Self::apply`] in place.
    #[inline(always)]
    pub(super) fn apply_in_place(self, row: (usize, usize), xs: &mut [f32]) {
        let drop = self.row(row);
        for (j, x) in xs.iter_mut().enumerate() {
            *x = drop(j, *x);
        }
    }
}

/// SplitMix64's finaliser (Steele, Lea and Flood 2014): a bijective mix of 64 bits.
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Key j's hash within a row: MurmurHash3's 32-bit finaliser of the row key and j, 32-bit
/// multiplies only, so that a row's loop vectorises.
#[inline(always)]
fn key_hash(row_key: u32, j: usize) -> u32 {
    let mut h = row_key ^ (j as u32).wrapping_mul(0x9E37_79B9);
    h ^= h >> 16;
    h = h.wrapping_mul(0x85EB_CA6B);
    h ^= h >> 13;
    h = h.wrapping_mul(0xC2B2_AE35);
    h ^ (h >> 16)
}

/// `x` through `mask` (element (r, 0, j) is column j of the r-th row of the last dimension), one
/// pass each way, on `flex` with autodiff (training); `None` elsewhere, where the caller uses
/// burn's `Dropout` (which does nothing in inference).
pub fn dropout<const D: usize>(x: &Tensor<D>, mask: DropoutMask) -> Option<Tensor<D>> {
    if route(&x.device()) != Route::Autodiff {
        return None;
    }
    let t = x.clone().try_into_primitive::<Ad>().ok()?;
    let input = contiguous(t.primitive());
    let shape = dims(&input);
    let output = flex_from(masked(slice(&input), shape[D - 1], mask), shape.clone());
    let out = record(
        DropoutBackward,
        [t.node()],
        DropoutSaved { mask, shape },
        output,
    );
    Some(Tensor::from_primitive::<Ad>(out))
}

/// `x` ([rows, dim] row-major) times `mask`'s multipliers, rows in parallel.
fn masked(x: &[f32], dim: usize, mask: DropoutMask) -> Vec<f32> {
    let _timer = profile::Timer::start(profile::Part::Elementwise);
    let mut out = zeros(x.len());
    if dim == 0 {
        return out;
    }
    let chunk = ELEMENTWISE_CHUNK.div_ceil(dim) * dim;
    let level = simd::current();
    out.par_chunks_mut(chunk)
        .zip(x.par_chunks(chunk))
        .enumerate()
        .for_each(|(c, (o, x))| {
            let first = c * chunk / dim;
            level.run(
                #[inline(always)]
                || {
                    for (r, (o, x)) in o.chunks_mut(dim).zip(x.chunks(dim)).enumerate() {
                        mask.apply((first + r, 0), x, o);
                    }
                },
            )
        });
    out
}

#[derive(Clone, Debug)]
struct DropoutSaved {
    mask: DropoutMask,
    shape: Vec<usize>,
}

#[derive(Debug)]
struct DropoutBackward;

impl Backward<Flex, 1> for DropoutBackward {
    type State = DropoutSaved;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let DropoutSaved { mask, shape } = ops.state;
        let grad = contiguous(&grads.consume::<Flex>(&ops.node));
        // dx = dy times the same multipliers.
        let dx = masked(slice(&grad), *shape.last().expect("rank ≥ 1"), mask);
        let parents = ops.parents.iter().map(|p| p.as_ref().map(|n| n.id));
        register_grads(grads, parents, [(Some(dx), shape)]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The mask keeps 1 − prob of the weights overall and in every key's column, two seeds' masks
    /// are independent (both keep (1 − prob)² of the weights), and `apply` (the kernels' row loop)
    /// keeps exactly the weights `keeps` names, scaled by 1 / (1 − prob).
    #[test]
    fn dropout_keeps_one_minus_its_rate_independently_of_seed_row_and_key() {
        let (d, e) = (DropoutMask::new(0.3, 5), DropoutMask::new(0.3, 6));
        let (rows, keys) = (16 * 64, 256);
        let (mut kept, mut both) = (0usize, 0usize);
        let mut per_key = vec![0usize; keys];
        for n in 0..16 {
            for i in 0..64 {
                for (j, column) in per_key.iter_mut().enumerate() {
                    let k = d.keeps(n, i, j);
                    kept += k as usize;
                    both += (k && e.keeps(n, i, j)) as usize;
                    *column += k as usize;
                }
            }
        }
        // 262,144 weights: a standard deviation of 0.0009 on either fraction.
        let total = (rows * keys) as f64;
        assert!((kept as f64 / total - 0.7).abs() < 0.005, "kept {kept}");
        assert!((both as f64 / total - 0.49).abs() < 0.005, "both {both}");
        // 1024 rows per key: a standard deviation of 0.014.
        for (j, c) in per_key.iter().enumerate() {
            assert!((*c as f64 / rows as f64 - 0.7).abs() < 0.07, "key {j}: {c}");
        }
        let src: Vec<f32> = (0..100).map(|x| x as f32 + 1.0).collect();
        let mut dst = vec![f32::NAN; 100];
        d.apply((3, 4), &src, &mut dst);
        let scale = 1.0 / (1.0 - 0.3f32);
        for (j, (&got, &x)) in dst.iter().zip(&src).enumerate() {
            let want = if d.keeps(3, 4, j) { x * scale } else { 0.0 };
            assert_eq!(got.to_bits(), want.to_bits(), "key {j}");
        }
    }
}
