//! `--dry-run`: what every run of an experiment needs, before a GPU is rented. The configuration of
//! the chosen profile is resolved, each model built on the chosen device, and per run the parameter
//! count, tokens per step, memory (parameters, gradients, optimizer state, activations at the run's
//! batch, the decoding cache) and, where this device's step time is known, the device-hours are
//! printed as a markdown table. `--dry-run=step` then takes one real training step of each model
//! (forward, backward, optimizer update) with the batch cut to one sequence, so that a shape or
//! configuration error surfaces on the CPU. Nothing is written.

use anyhow::{Result, bail};
use burn::module::{Module, ModuleVisitor, Param};
use burn::prelude::*;
use burn::tensor::Device;
use data::tokenize::TokenizerSpec;
use model::t5::T5Model;
use model::{LanguageModel, ModelConfig};
use training::optimizer::OptimizerConfig;
use training::trainer::{Stepper, Task, TrainConfig};

pub use crate::cli::DryRun;

/// One run's needs, as `--dry-run` prints them.
#[derive(Clone, Debug)]
pub struct RunPlan {
    /// What is run: `model @ context`, or the pipeline stage.
    pub label: String,
    /// Seeds (or runs) of this configuration.
    pub runs: usize,
    /// Parameters of the built model.
    pub params: usize,
    /// Tokens per optimizer step (all sequences, all devices).
    pub tokens_per_step: usize,
    /// Optimizer steps per run.
    pub steps: usize,
    /// Floats of optimizer state.
    pub optimizer_floats: f64,
    /// Floats the backward pass keeps, at the run's per-device batch.
    pub activation_floats: f64,
    /// Floats of the decoding cache of one sequence at the run's length (0: the run does not decode).
    pub kv_cache_floats: f64,
    /// Training FLOPs of one run (analytic, [`model::flops`]).
    pub train_flops: f64,
    /// Seconds per step on this device, where a calibration of this configuration is known.
    pub step_seconds: Option<f64>,
}

impl RunPlan {
    /// Bytes of one device's memory: parameters and (when the run trains) their gradients,
    /// optimizer state and kept activations, at 4 bytes per float.
    pub fn train_bytes(&self) -> f64 {
        self.bytes_with_activations(self.activation_floats)
    }

    /// [`Self::train_bytes`] with `activation_floats` kept instead of the run's batch's (the real
    /// step's one sequence).
    pub fn bytes_with_activations(&self, activation_floats: f64) -> f64 {
        4.0 * (self.weight_floats() + self.optimizer_floats + activation_floats)
    }

    /// Parameters, and their gradients when the run trains (`steps > 0`).
    fn weight_floats(&self) -> f64 {
        let copies = if self.steps > 0 { 2.0 } else { 1.0 };
        copies * self.params as f64
    }

    /// Device-hours of all this configuration's runs, where the step time is known.
    pub fn device_hours(&self) -> Option<f64> {
        self.step_seconds
            .map(|s| s * self.steps as f64 * self.runs as f64 / 3600.0)
    }
}

/// Bytes in GiB, two decimals, below 1 GiB in MiB (so that small sizes do not read as zero).
fn gib(bytes: f64) -> String {
    let g = bytes / (1u64 << 30) as f64;
    if bytes == 0.0 {
        "0".into()
    } else if g >= 1.0 {
        format!("{g:.2} GiB")
    } else {
        format!("{:.2} MiB", bytes / (1u64 << 20) as f64)
    }
}

/// The plan as a markdown table, with totals.
pub fn render(title: &str, plans: &[RunPlan]) -> String {
    let mut s = format!(
        "## {title}\n\n| run | runs | parameters | tokens / step | steps | weights (+ gradients) | optimizer state | activations | total | KV cache / sequence | training PFLOPs | device-hours |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    );
    let mut hours = Some(0.0);
    let mut flops = 0.0;
    for p in plans {
        let h = p.device_hours();
        hours = hours.zip(h).map(|(a, b)| a + b);
        flops += p.train_flops * p.runs as f64;
        s.push_str(&format!(
            "| {} | {} | {:.1}M | {} | {} | {} | {} | {} | {} | {} | {:.3} | {} |\n",
            p.label,
            p.runs,
            p.params as f64 / 1e6,
            p.tokens_per_step,
            p.steps,
            gib(4.0 * p.weight_floats()),
            gib(4.0 * p.optimizer_floats),
            gib(4.0 * p.activation_floats),
            gib(p.train_bytes()),
            if p.kv_cache_floats > 0.0 {
                gib(4.0 * p.kv_cache_floats)
            } else {
                "—".into()
            },
            p.train_flops * p.runs as f64 / 1e15,
            h.map_or("unknown".into(), |h| format!("{h:.3}")),
        ));
    }
    let peak = plans.iter().map(RunPlan::train_bytes).fold(0.0, f64::max);
    s.push_str(&format!(
        "\n{} runs; the largest needs {} per device; {:.3} PFLOPs of training in all; device-hours {}.\n",
        plans.iter().map(|p| p.runs).sum::<usize>(),
        gib(peak),
        flops / 1e15,
        match hours {
            Some(h) if !plans.is_empty() => format!("{h:.2} (from this device's step-time calibration)"),
            _ => "unknown for some runs: no step time of this device at these sizes (a sweep's calibration, `step_times.csv`, gives it)".into(),
        }
    ));
    s.push_str("Memory is an analytic estimate of the reference kernels (`crates/model/src/memory.rs`): 4-byte floats, no allocator slack or transient buffers.\n");
    s
}

/// Prints the plan of experiment `cli.id` under the heading `<id> --profile <p> on <device><note>`.
pub fn print(cli: &crate::Cli, note: &str, plans: &[RunPlan]) {
    let title = format!(
        "{} --profile {} on {}{note}",
        cli.id,
        cli.profile.name(),
        training::device::describe(cli.backend)
    );
    println!("{}", render(&title, plans));
}

/// What the datasets a profile reads need on disk, one line per dataset and split
/// ([`data::source::data_need`]): the hub listing's sizes where the hub answers, else why not.
pub fn print_data(
    options: &data::source::SourceOptions,
    reads: &[(&str, &[data::Split])],
) -> anyhow::Result<()> {
    println!("Data (a hub split is downloaded as the runs read it; `datasets fetch NAME --split S --max-shards N` fetches ahead):
");
    let mut seen = std::collections::BTreeSet::new();
    for (name, splits) in reads {
        let spec = data::registry::lookup(name)?;
        for &split in *splits {
            if seen.insert((spec.name, split.name())) {
                println!(
                    "- {} {split}: {}",
                    spec.name,
                    data::source::data_need(spec, split, options)
                );
            }
        }
    }
    println!();
    Ok(())
}

/// The shapes of every float parameter of `module`.
pub fn param_shapes<M: Module>(module: &M) -> Vec<Vec<usize>> {
    struct Shapes(Vec<Vec<usize>>);
    impl ModuleVisitor for Shapes {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            // The lazy shape: an uninitialised parameter is not materialised for its shape.
            self.0.push(param.lazy_shape().to_vec());
        }
    }
    let mut s = Shapes(Vec::new());
    module.visit(&mut s);
    s.0
}

/// The parameter count of `module` and its optimizer-state floats under `optimizer`, from the
/// parameters' shapes (nothing materialised).
pub fn param_stats<M: Module>(module: &M, optimizer: &OptimizerConfig) -> (usize, f64) {
    let shapes = param_shapes(module);
    let params = shapes.iter().map(|s| s.iter().product::<usize>()).sum();
    (params, optimizer.state_floats(&shapes))
}

/// Hub tokenizers whose size the dry run knows without downloading them (their `tokenizer.json`:
/// T5's SentencePiece vocabulary of 32,000 pieces plus 100 sentinels).
const KNOWN_HUB_VOCABS: [(&str, usize); 1] = [("google-t5/t5-base", 32_100)];

/// The vocabulary size a tokenizer spec will give, without training or downloading it.
pub fn vocab_size(spec: &str) -> Result<usize> {
    let parsed: TokenizerSpec = spec.parse()?;
    if let Some(n) = parsed.known_vocab_size() {
        return Ok(n);
    }
    match &parsed {
        TokenizerSpec::File(path) => Ok(data::tokenize::Tok::from_file(path)?.vocab_size()),
        TokenizerSpec::Hub(repo) => KNOWN_HUB_VOCABS
            .iter()
            .find(|(name, _)| name == repo)
            .map(|&(_, n)| n)
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "--dry-run: the vocabulary size of hub:{repo} is not known offline; pass its tokenizer.json as file:PATH"
                )
            }),
        _ => unreachable!("known_vocab_size covers the other specs"),
    }
}

/// A training task of synthetic token windows (one sequence per batch) for the real step: the
/// dry run needs shapes and memory, not data, so it runs where the dataset is absent.
pub struct SyntheticLm {
    context: usize,
    vocab: usize,
    masked: bool,
}

impl SyntheticLm {
    pub fn new(context: usize, vocab: usize, masked: bool) -> Self {
        Self {
            context,
            vocab,
            masked,
        }
    }

    /// A deterministic window of `len` token ids in the vocabulary.
    fn window(&self, len: usize) -> Vec<i64> {
        (0..len)
            .map(|i| ((i * 7919 + 13) % self.vocab) as i64)
            .collect()
    }
}

impl Task<LanguageModel> for SyntheticLm {
    type State = ();

    fn train_loss(&mut self, model: &LanguageModel, device: &Device) -> Result<(Tensor<1>, usize)> {
        let t = self.context;
        let loss = if self.masked {
            let ids: Tensor<2, Int> =
                Tensor::from_data(TensorData::new(self.window(t), [1, t]), device);
            // Every seventh position predicted (any mask exercises the same shapes).
            let predict: Vec<f32> = (0..t).map(|i| if i % 7 == 0 { 1.0 } else { 0.0 }).collect();
            let predict: Tensor<2> = Tensor::from_data(TensorData::new(predict, [1, t]), device);
            model::masked_lm_loss(model, ids.clone(), ids, predict, None)
        } else {
            let ids: Tensor<2, Int> =
                Tensor::from_data(TensorData::new(self.window(t + 1), [1, t + 1]), device);
            model::causal_lm_loss(model, ids)
        };
        Ok((loss, t))
    }

    fn eval_loss(&mut self, _model: &LanguageModel, _device: &Device) -> Result<f64> {
        bail!("the dry run's synthetic task has no held-out data")
    }

    fn state(&self) {}

    fn restore(&mut self, _state: ()) -> Result<()> {
        Ok(())
    }
}

/// The process's peak resident memory since the last reset, in bytes (Linux; none elsewhere).
fn peak_rss() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024.0)
}

/// Resets the peak-RSS counter to the current RSS (Linux's `clear_refs` 5).
fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// Bytes of memory available to this process now (Linux's `MemAvailable`).
fn available_memory() -> Option<f64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024.0)
}

/// A T5 training task of synthetic examples (one per batch) for the real step.
pub struct SyntheticSeq2Seq {
    input_length: usize,
    target_length: usize,
    vocab: usize,
}

impl SyntheticSeq2Seq {
    pub fn new(input_length: usize, target_length: usize, vocab: usize) -> Self {
        Self {
            input_length,
            target_length,
            vocab,
        }
    }
}

impl Task<T5Model> for SyntheticSeq2Seq {
    type State = ();

    fn train_loss(&mut self, model: &T5Model, device: &Device) -> Result<(Tensor<1>, usize)> {
        let (s, t) = (self.input_length, self.target_length);
        // Ids from 2 up: 0 is T5's pad, which the loss would skip.
        let ids = |n: usize| -> Vec<i64> {
            (0..n)
                .map(|i| (2 + (i * 7919 + 13) % (self.vocab - 2)) as i64)
                .collect()
        };
        let inputs: Tensor<2, Int> = Tensor::from_data(TensorData::new(ids(s), [1, s]), device);
        let targets: Tensor<2, Int> = Tensor::from_data(TensorData::new(ids(t), [1, t]), device);
        let keep = inputs.clone().greater_equal_elem(0);
        Ok((model.loss(inputs, &keep, targets), s + t))
    }

    fn eval_loss(&mut self, _model: &T5Model, _device: &Device) -> Result<f64> {
        bail!("the dry run's synthetic task has no held-out data")
    }

    fn state(&self) {}

    fn restore(&mut self, _state: ()) -> Result<()> {
        Ok(())
    }
}

/// One real training step (forward, backward, optimizer update) of `build()`'s model on `task`
/// (one sequence); prints its loss, seconds and, on the CPU, how much the peak memory grew beside
/// `estimate` bytes. A step whose estimate exceeds the memory this machine has free is skipped
/// with a line saying so, not attempted.
pub fn real_step<M: Module + Clone, T: Task<M>>(
    label: &str,
    (estimate, tokens): (f64, usize),
    build: impl FnOnce() -> M,
    task: T,
    train: &TrainConfig,
    device: &Device,
) -> Result<()> {
    if let Some(free) = available_memory().filter(|&free| estimate > free) {
        eprintln!(
            "{label}: real step skipped: it needs at least {} and this machine has {} free",
            gib(estimate),
            gib(free)
        );
        return Ok(());
    }
    let measure = reset_peak_rss();
    let before = peak_rss();
    let mut stepper = Stepper::new(train, build(), task, std::slice::from_ref(device))?;
    let (seconds, loss) = stepper.step()?;
    if !loss.is_finite() {
        bail!("{label}: the real step's loss is {loss}; the configuration does not train");
    }
    let measured = match (measure, before, peak_rss()) {
        (true, Some(b), Some(a)) => format!(
            "peak resident memory grew {} (memory earlier steps freed is reused)",
            gib(a - b)
        ),
        _ => "peak memory not measurable here".into(),
    };
    eprintln!(
        "{label}: one step of {tokens} tokens: loss {loss:.3}, {seconds:.1} s; estimated {}, {measured}",
        gib(estimate)
    );
    Ok(())
}

/// [`real_step`] of a language model: one sequence of `config.context` synthetic tokens.
pub fn real_lm_step(
    plan: &RunPlan,
    config: &ModelConfig,
    masked: bool,
    train: &TrainConfig,
    device: &Device,
) -> Result<()> {
    let direction = if masked {
        model::Direction::Bidirectional
    } else {
        model::Direction::Causal
    };
    let estimate = plan.bytes_with_activations(
        config.activation_floats_per_token(config.context) * config.context as f64,
    );
    real_step(
        &plan.label,
        (estimate, config.context),
        || config.init(direction, device),
        SyntheticLm::new(config.context, config.vocab_size, masked),
        train,
        device,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use model::Architecture;
    use model::t5::T5Config;

    #[test]
    fn lazy_shapes_count_what_the_built_model_holds() {
        // The dry run counts parameters from their shapes without materialising them; the count
        // must be burn's own of the same model once materialised.
        let device = Device::flex();
        for arch in Architecture::ALL {
            let config = ModelConfig::tiny(arch);
            let (lazy, _) = param_stats(
                &config.init(model::Direction::Causal, &device),
                &OptimizerConfig::adafactor(),
            );
            let built = config.init(model::Direction::Causal, &device);
            // Forward once so every parameter is materialised before burn counts it.
            let ids: Tensor<2, Int> =
                Tensor::from_data(TensorData::new(vec![1i64; 8], [1, 8]), &device);
            let _ = built.forward(ids, None);
            assert_eq!(lazy, built.num_params(), "{arch:?}");
        }
        for groups in [4, 2, 1] {
            let t5 = T5Config::new(32, 64, 4, 2, 2, groups)
                .with_d_kv(8)
                .with_vocab_size(64);
            let (lazy, _) = param_stats(&t5.init(&device), &OptimizerConfig::adafactor());
            assert_eq!(
                lazy,
                t5.init(&device).num_params(),
                "T5 with {groups} K/V heads"
            );
        }
    }

    #[test]
    fn vocab_sizes_without_data() {
        assert_eq!(vocab_size("bpe:4096").unwrap(), 4096);
        assert_eq!(vocab_size("hub:google-t5/t5-base").unwrap(), 32_100);
        let err = vocab_size("hub:someone/else").unwrap_err().to_string();
        assert!(err.contains("file:PATH"), "{err}");
    }

    #[test]
    fn a_plan_totals_its_runs() {
        let plan = RunPlan {
            label: "m @ 8".into(),
            runs: 3,
            params: 1 << 20,
            tokens_per_step: 8,
            steps: 10,
            optimizer_floats: 0.0,
            activation_floats: (1 << 20) as f64,
            kv_cache_floats: 0.0,
            train_flops: 1e15,
            step_seconds: Some(36.0),
        };
        // Weights, gradients and activations: 3 Mi floats = 12 MiB; 3 runs × 10 steps × 36 s.
        assert_eq!(plan.train_bytes(), 12.0 * (1 << 20) as f64);
        assert_eq!(plan.device_hours(), Some(0.3));
        let table = render("t", &[plan]);
        assert!(table.contains("| m @ 8 | 3 | 1.0M | 8 | 10 | 8.00 MiB | 0 | 4.00 MiB | 12.00 MiB | — | 3.000 | 0.300 |"), "{table}");
    }
}
