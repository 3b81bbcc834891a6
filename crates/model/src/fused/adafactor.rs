//! Adafactor's update (Shazeer & Stern 2018), the optimizer of both papers, as burn-optim 0.22's
//! `Adafactor` computes it, in three parallel passes over a parameter instead of burn's fifteen-odd
//! tensor ops (each a pass, most on one thread): a T5 training step at gqa_table1's sizes spent a
//! tenth of its time in them.
//!
//! For a parameter W [..., R, C] with gradient G (a matrix per leading index) and step t:
//!
//! ```text
//! r ← (1 − t^decay) r + t^decay · mean_C(G² + ε₁)        row second moments   [..., R, 1]
//! c ← (1 − t^decay) c + t^decay · mean_R(G² + ε₁)        column moments       [..., 1, C]
//! U = G / sqrt(r / mean_R(r)) / sqrt(c)
//! W ← W · (1 − lr · wd) − step · max(ε₂, RMS(W)) · U / max(1, RMS(U) / clip)
//! ```
//!
//! (the first step takes the new moments alone; step = lr, or min(lr, t^−½) with a relative step;
//! the RMS(W) factor only with `scale_parameter`); a vector keeps its full second moment v and
//! U = G / sqrt(v). Pass one sums the squared gradient by row and by column (and W², for its RMS),
//! pass two U² (for its RMS) and pass three writes W, U recomputed each time rather than stored.

#[allow(unused_imports)]
use super::*;

/// burn-optim's `AdafactorConfig` fields that [`adafactor_step`] reads.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdafactorSettings {
    /// Added to the squared gradient (burn: 1e-30).
    pub epsilon_1: f32,
    /// Lower bound of RMS(W) when the update is scaled by it (burn: 1e-3).
    pub epsilon_2: f32,
    /// Most RMS of the normalised update (burn, T5: 1).
    pub clip_threshold: f32,
    /// Exponent of the second moments' decay 1 − t^decay_rate (burn, T5: −0.8).
    pub decay_rate: f64,
    /// Whether the learning rate is capped by t^−½.
    pub relative_step: bool,
    /// Whether the update is multiplied by max(ε₂, RMS(W)) (T5's `multiply_by_parameter_scale`).
    pub scale_parameter: bool,
    /// Decoupled weight decay, times the learning rate.
    pub weight_decay: f32,
}

impl AdafactorSettings {
    /// T5's and t5x's Adafactor: decay −0.8, update clipping at RMS 1, no relative step, the update
    /// scaled by RMS(W) (`multiply_by_parameter_scale`), no weight decay; burn's epsilons.
    pub fn t5() -> Self {
        Self {
            epsilon_1: Adafactor::EPSILON_1,
            epsilon_2: Adafactor::EPSILON_2,
            clip_threshold: 1.0,
            decay_rate: -0.8,
            relative_step: false,
            scale_parameter: true,
            weight_decay: 0.0,
        }
    }
}

/// burn-optim's `Adafactor` with each parameter's update on [`adafactor_step`] where it runs and
/// burn's own elsewhere (other devices, `REPRO_KERNELS=reference`). Its state is burn's
/// `AdafactorState`, so an optimizer record written by either resumes on the other.
#[derive(Clone)]
pub struct Adafactor {
    settings: AdafactorSettings,
    reference: burn::optim::Adafactor,
}

impl Adafactor {
    /// burn-optim's defaults of the fields the caller does not set (`AdafactorConfig`).
    pub const EPSILON_1: f32 = 1e-30;
    /// See [`Self::EPSILON_1`].
    pub const EPSILON_2: f32 = 1e-3;

    /// The optimizer of `settings`; its reference is burn's `Adafactor` with the same fields.
    pub fn new(settings: AdafactorSettings) -> Self {
        let reference = burn::optim::AdafactorConfig::new()
            .with_epsilon_1(settings.epsilon_1)
            .with_epsilon_2(settings.epsilon_2)
            .with_clip_threshold(settings.clip_threshold)
            .with_decay_rate(settings.decay_rate)
            .with_relative_step(settings.relative_step)
            .with_scale_parameter(settings.scale_parameter)
            .with_weight_decay(settings.weight_decay)
            .build();
        Self {
            settings,
            reference,
        }
    }
}

impl burn::optim::Optimizer for Adafactor {
    type State<const D: usize> = burn::optim::AdafactorState<D>;

    fn step<const D: usize>(
        &self,
        lr: burn::optim::LearningRate,
        tensor: Tensor<D>,
        grad: Tensor<D>,
        state: Option<Self::State<D>>,
    ) -> (Tensor<D>, Option<Self::State<D>>) {
        let time = state.as_ref().map_or(1, |s| s.time + 1);
        let moments = state
            .as_ref()
            .map(|s| (s.second_moment.clone(), s.column_second_moment.clone()));
        match adafactor_step(&self.settings, lr, time, (&tensor, &grad), moments.as_ref()) {
            Some((tensor, (second_moment, column_second_moment))) => {
                let state = burn::optim::AdafactorState {
                    time,
                    second_moment,
                    column_second_moment,
                };
                (tensor, Some(state))
            }
            None => self.reference.step(lr, tensor, grad, state),
        }
    }

    fn to_device<const D: usize>(state: Self::State<D>, device: &Device) -> Self::State<D> {
        <burn::optim::Adafactor as burn::optim::Optimizer>::to_device(state, device)
    }
}

/// A parameter's second moments: rows [..., R, 1] and columns [..., 1, C] (a matrix or a stack of
/// them), or the full [n] of a vector (columns `None`), as burn's `AdafactorState` keeps them.
pub type Moments<const D: usize> = (Tensor<D>, Option<Tensor<D>>);

/// Floats per task of a pass, at least (whole rows): the tasks' partial column sums are added in
/// task order, so the result does not depend on the thread count.
const TASK_FLOATS: usize = 1 << 15;

/// Most tasks per matrix, which bounds the partial column sums of a wide matrix (an LM head
/// [d, V] would otherwise have one task, and one V-long partial, per row or two).
const MAX_TASKS_PER_MATRIX: usize = 32;

/// One Adafactor step of `param` with `grad` at step `time` (1 for the first, whose `moments`
/// are `None`): the new parameter and second moments, or `None` where the fused kernels do not run
/// (off plain `flex`, not f32), where the caller takes burn-optim's `Adafactor`.
pub fn adafactor_step<const D: usize>(
    settings: &AdafactorSettings,
    lr: f64,
    time: usize,
    (param, grad): (&Tensor<D>, &Tensor<D>),
    moments: Option<&Moments<D>>,
) -> Option<(Tensor<D>, Moments<D>)> {
    if route(&param.device()) != Route::Plain
        || param.dtype() != burn::tensor::DType::F32
        || grad.dtype() != burn::tensor::DType::F32
    {
        return None;
    }
    let flat = |t: &Tensor<D>| -> Option<FlexTensor> {
        let t = t.clone().try_into_primitive::<Flex>().ok()?;
        Some(contiguous(&t))
    };
    let (w, g) = (flat(param)?, flat(grad)?);
    let shape = dims(&w);
    let (rows, cols) = match D {
        1 => (shape[0], 1),
        _ => (shape[D - 2], shape[D - 1]),
    };
    let previous = match moments {
        Some((r, c)) => {
            let c = match c {
                Some(c) => Some(flat(c)?),
                None => None,
            };
            Some((flat(r)?, c))
        }
        None => None,
    };
    let new_weight = if moments.is_some() {
        (time as f64).powf(settings.decay_rate)
    } else {
        1.0
    };
    let step = Step {
        settings: *settings,
        lr,
        time,
        new_weight: new_weight as f32,
        old_weight: (1.0 - new_weight) as f32,
    };
    let (w, g) = (slice(&w), slice(&g));
    let previous = previous
        .as_ref()
        .map(|(r, c)| (slice(r), c.as_ref().map(slice)));
    let (param, rows_m, cols_m) = if D == 1 {
        let (param, moment) = step.vector(w, g, previous.map(|(v, _)| v));
        (param, moment, None)
    } else {
        let (param, r, c) = step.factored(w, g, (rows, cols), previous);
        (param, r, Some(c))
    };
    let tensor = |data: Vec<f32>, shape: Vec<usize>| {
        Tensor::<D>::from_primitive::<Flex>(flex_from(data, shape))
    };
    let (row_shape, col_shape) = if D == 1 {
        (shape.clone(), shape.clone())
    } else {
        let mut r = shape.clone();
        r[D - 1] = 1;
        let mut c = shape.clone();
        c[D - 2] = 1;
        (r, c)
    };
    Some((
        tensor(param, shape.clone()),
        (
            tensor(rows_m, row_shape),
            cols_m.map(|c| tensor(c, col_shape)),
        ),
    ))
}

/// One step's scalars.
struct Step {
    settings: AdafactorSettings,
    lr: f64,
    time: usize,
    new_weight: f32,
    old_weight: f32,
}

impl Step {
    /// The moving average of an old moment and a new one.
    fn average(&self, old: Option<f32>, new: f32) -> f32 {
        match old {
            Some(old) => old * self.old_weight + new * self.new_weight,
            None => new,
        }
    }

    /// W's multiplier and U's: W ← W · decay − U · factor, given Σ W² and Σ U² over its n elements.
    fn factors(&self, (sum_w2, sum_u2): (f64, f64), n: usize) -> (f32, f32) {
        let s = &self.settings;
        let rms_u = (sum_u2 / n as f64).sqrt() as f32;
        let clipping = (rms_u / s.clip_threshold).max(1.0);
        let step_size = if s.relative_step {
            self.lr.min(1.0 / (self.time as f64).sqrt())
        } else {
            self.lr
        };
        let scale = if s.scale_parameter {
            ((sum_w2 / n as f64).sqrt() as f32).max(s.epsilon_2)
        } else {
            1.0
        };
        let decay = if s.weight_decay == 0.0 {
            1.0
        } else {
            (1.0 - self.lr * s.weight_decay as f64) as f32
        };
        (decay, scale * step_size as f32 / clipping)
    }

    /// A vector: its full second moment.
    fn vector(&self, w: &[f32], g: &[f32], old: Option<&[f32]>) -> (Vec<f32>, Vec<f32>) {
        let eps = self.settings.epsilon_1;
        let moment: Vec<f32> = g
            .iter()
            .enumerate()
            .map(|(i, &x)| self.average(old.map(|o| o[i]), x * x + eps))
            .collect();
        let sum_w2: f64 = w.iter().map(|&x| (x as f64) * (x as f64)).sum();
        let sum_u2: f64 = g
            .iter()
            .zip(&moment)
            .map(|(&x, &v)| (x / v.sqrt()) as f64)
            .map(|u| u * u)
            .sum();
        let (decay, factor) = self.factors((sum_w2, sum_u2), w.len());
        let param = w
            .iter()
            .zip(g.iter().zip(&moment))
            .map(|(&x, (&gx, &v))| x * decay - gx / v.sqrt() * factor)
            .collect();
        (param, moment)
    }

    /// A stack of [rows, cols] matrices: row and column moments per matrix.
    fn factored(
        &self,
        w: &[f32],
        g: &[f32],
        (rows, cols): (usize, usize),
        old: Option<(&[f32], Option<&[f32]>)>,
    ) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let level = simd::current();
        let eps = self.settings.epsilon_1;
        let matrices = w.len() / (rows * cols).max(1);
        let per_task = TASK_FLOATS
            .div_ceil(cols.max(1))
            .max(rows.div_ceil(MAX_TASKS_PER_MATRIX))
            .max(1);
        let tasks_per_matrix = rows.div_ceil(per_task);
        // Pass one, per task of rows: the rows' mean of G² + ε₁, the columns' partial sums, Σ W².
        // Task t's matrix and its rows r0..r1 over the whole stack.
        let task_rows = |task: usize| {
            let (m, r0) = (task / tasks_per_matrix, task % tasks_per_matrix * per_task);
            (m, m * rows + r0, m * rows + (r0 + per_task).min(rows))
        };
        let firsts: Vec<(Vec<f32>, Vec<f32>, f64)> = (0..matrices * tasks_per_matrix)
            .into_par_iter()
            .map(|task| {
                let (_, r0, r1) = task_rows(task);
                let at = r0 * cols..r1 * cols;
                let (w, g) = (&w[at.clone()], &g[at]);
                level.run(
                    #[inline(always)]
                    || {
                        let mut col_sums = vec![0f32; cols];
                        let row_means: Vec<f32> = g
                            .chunks(cols)
                            .map(|row| {
                                for (c, &x) in col_sums.iter_mut().zip(row) {
                                    *c += x * x + eps;
                                }
                                simd::sum_map(row, |x| x * x + eps) / cols as f32
                            })
                            .collect();
                        let sum_w2 = simd::sum_map(w, |x| x * x);
                        (row_means, col_sums, sum_w2 as f64)
                    },
                )
            })
            .collect();
        let mut row_m = Vec::with_capacity(matrices * rows);
        let mut col_m = vec![0f32; matrices * cols];
        let mut sum_w2 = 0f64;
        for (m, tasks) in firsts.chunks(tasks_per_matrix).enumerate() {
            let mut col_sums = vec![0f64; cols];
            for (row_means, partial, w2) in tasks {
                row_m.extend_from_slice(row_means);
                col_sums
                    .iter_mut()
                    .zip(partial)
                    .for_each(|(a, &b)| *a += b as f64);
                sum_w2 += w2;
            }
            let cm = &mut col_m[m * cols..(m + 1) * cols];
            cm.iter_mut()
                .zip(col_sums)
                .for_each(|(c, s)| *c = (s / rows as f64) as f32);
        }
        if let Some((old_r, old_c)) = old {
            let old_c = old_c.expect("a factored Adafactor state has column moments");
            row_m
                .iter_mut()
                .zip(old_r)
                .for_each(|(r, &o)| *r = self.average(Some(o), *r));
            col_m
                .iter_mut()
                .zip(old_c)
                .for_each(|(c, &o)| *c = self.average(Some(o), *c));
        }
        // U = G · row_inv[r] · col_inv[c], with row_inv = 1 / sqrt(r / mean_R(r)) and col_inv =
        // 1 / sqrt(c) per matrix.
        let row_inv: Vec<f32> = row_m
            .chunks(rows)
            .flat_map(|r| {
                let mean = (r.iter().map(|&x| x as f64).sum::<f64>() / rows as f64) as f32;
                r.iter().map(move |&x| 1.0 / (x / mean).sqrt())
            })
            .collect();
        let col_inv: Vec<f32> = col_m.iter().map(|&c| 1.0 / c.sqrt()).collect();
        let col_inv2: Vec<f32> = col_inv.iter().map(|&c| c * c).collect();
        // Pass two: Σ U².
        let sum_u2: f64 = (0..matrices * tasks_per_matrix)
            .into_par_iter()
            .map(|task| {
                let (m, r0, r1) = task_rows(task);
                let ci2 = &col_inv2[m * cols..(m + 1) * cols];
                level.run(
                    #[inline(always)]
                    || {
                        // Σ_c (x · ri · ci)² = ri² · Σ_c x² ci².
                        (r0..r1)
                            .map(|r| {
                                let row = &g[r * cols..(r + 1) * cols];
                                let ri = row_inv[r];
                                (ri * ri * simd::sum_map2(row, ci2, |x, c| x * x * c)) as f64
                            })
                            .sum::<f64>()
                    },
                )
            })
            .collect::<Vec<f64>>()
            .into_iter()
            .sum();
        let (decay, factor) = self.factors((sum_w2, sum_u2), w.len());
        // Pass three: W.
        let mut param = zeros(w.len());
        let mut outs: Vec<&mut [f32]> = Vec::with_capacity(matrices * tasks_per_matrix);
        for matrix in param.chunks_mut(rows * cols) {
            let mut rest = matrix;
            while !rest.is_empty() {
                let (task, tail) = rest.split_at_mut((per_task * cols).min(rest.len()));
                outs.push(task);
                rest = tail;
            }
        }
        outs.into_par_iter().enumerate().for_each(|(task, out)| {
            let (m, r0, r1) = task_rows(task);
            let ci = &col_inv[m * cols..(m + 1) * cols];
            level.run(
                #[inline(always)]
                || {
                    for (r, out) in (r0..r1).zip(out.chunks_mut(cols)) {
                        let k = row_inv[r] * factor;
                        let (w, g) = (&w[r * cols..(r + 1) * cols], &g[r * cols..]);
                        for (o, ((&x, &gx), &c)) in out.iter_mut().zip(w.iter().zip(g).zip(ci)) {
                            *o = x * decay - gx * c * k;
                        }
                    }
                },
            )
        });
        (param, row_m, col_m)
    }
}
