//! Decoding time against the number of K/V groups (the GQA paper's Figure 6): greedy decoding of a
//! T5.1.1-shaped model with G ∈ {1, 4, 8, 16, 32, 64} K/V heads for H = 64 query heads, every
//! sequence decoding exactly the output length.
//!
//! The three parts of a sample's time are timed apart, because on a CPU (about 10 FLOPs per byte
//! of memory traffic, a TPUv4 about 200) the compute-bound parts weigh far more than on the
//! paper's hardware: the encoder (the same multi-head encoder for every G, timed once), the
//! cross-attention K/V projection of its output (once per sample, ∝ G) and the decoding steps,
//! which read the decoder's weights and the K/V cache (∝ G) once per generated token. The steps
//! of every G are timed in interleaved rounds (one warm-up round, the median of the rest), with
//! all models in memory sharing the G-independent encoder, embedding and LM head. Time per
//! sample = encoder + K/V projection per sample + the batch's decoding time / batch.

use std::time::Instant;

use anyhow::{Context, Result, bail};
use burn::prelude::*;
use model::fused::PackedWeight;
use model::runtime::{product_gflops, read_bandwidth_gbps};
use model::t5::{DecodeStepCost, Stop, T5Config, T5Model};
use serde::{Deserialize, Serialize};

use std::path::Path;

use super::decode_render::{DecodeRow, RoundRow, render};
use crate::dry_run::DryRun;
use crate::experiment::Experiment;
use crate::{Cli, Progress, median, write_csv};

/// The sweep, one file per scale under `experiments/configs/gqa_fig6/`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecodeConfig {
    /// What the run reproduces.
    pub description: String,
    /// Model width.
    pub d_model: usize,
    /// Feed-forward width.
    pub d_ff: usize,
    /// Query heads H (every entry of `groups` must divide it).
    pub n_heads: usize,
    /// Head width.
    pub d_kv: usize,
    /// Encoder layers.
    pub n_encoder_layers: usize,
    /// Decoder layers.
    pub n_decoder_layers: usize,
    /// Vocabulary (the LM head's cost per decoded token).
    pub vocab_size: usize,
    /// K/V head counts G to time.
    pub groups: Vec<usize>,
    /// Input tokens per sample (paper: 2048).
    pub input_length: usize,
    /// Decoded tokens per sample (paper: 512).
    pub output_length: usize,
    /// Samples decoded together (paper: up to 32 per TPUv4 chip).
    pub batch: usize,
    /// Samples per timed encoder pass and cross-attention K/V projection; must divide `batch`.
    /// Both are compute-bound (their time is linear in the batch) and reported per sample; the
    /// decoder starts from this batch's cache repeated to `batch` samples
    /// (`DecoderCache::repeat_batch`). XXL shapes at input 2048: 1, as the encoder's
    /// [B, 64, 2048, 2048] attention scores take 1 GiB per sample.
    pub encoder_batch: usize,
    /// Untimed rounds before timing.
    pub warmup: usize,
    /// Timed rounds (each times every G once); the median is reported.
    pub repeats: usize,
    /// Seed of the weights and inputs.
    pub seed: u64,
    /// Bytes of the buffer read to measure this machine's memory read bandwidth, the ceiling of a
    /// decoding step (far larger than the caches: 1 GiB); 0 skips the measurement.
    pub bandwidth_bytes: usize,
    /// Side N of the f32 product `[N, N] · [N, N]` timed to measure this machine's matrix-product
    /// rate, the other ceiling of a decoding step (through the product the models' dense layers
    /// use); 0 skips the measurement, and with it the roofline.
    #[serde(default)]
    pub product_size: usize,
}

impl DecodeConfig {
    fn model(&self, groups: usize) -> T5Config {
        T5Config::new(
            self.d_model,
            self.d_ff,
            self.n_heads,
            self.n_encoder_layers,
            self.n_decoder_layers,
            groups,
        )
        .with_d_kv(self.d_kv)
        .with_vocab_size(self.vocab_size)
    }

    /// Bytes of the decoding cache at the end of a decode: self-attention K/V of every output
    /// position plus cross-attention K/V of every input position, per decoder layer, f32.
    fn cache_bytes(&self, groups: usize) -> usize {
        self.n_decoder_layers
            * (self.input_length + self.output_length)
            * 2
            * self.batch
            * groups
            * self.d_kv
            * 4
    }

    /// What one decoding step of the batch computes and reads, averaged over the steps: the
    /// self-attention reads the positions decoded so far, 1..=T, mean (T + 1) / 2.
    fn step_cost(&self, groups: usize) -> DecodeStepCost {
        let self_positions = (self.output_length as f64 + 1.0) / 2.0;
        self.model(groups)
            .decode_step_cost(self.batch, self.input_length, self_positions)
    }
}

fn dry_run(cli: &Cli, config: &DecodeConfig, device: &Device) -> Result<()> {
    let mut plans = Vec::new();
    for &groups in &config.groups {
        let t5 = config.model(groups);
        let (params, _) = crate::dry_run::param_stats(
            &t5.init(device),
            &training::optimizer::OptimizerConfig::adafactor(),
        );
        plans.push(crate::dry_run::RunPlan {
            label: format!("decode G = {groups}, batch {}", config.batch),
            runs: 1,
            params,
            tokens_per_step: config.batch * (config.input_length + config.output_length),
            steps: 0,
            optimizer_floats: 0.0,
            activation_floats: 0.0,
            kv_cache_floats: config.batch as f64
                * t5.kv_cache_floats_per_sequence(config.input_length, config.output_length),
            train_flops: 0.0,
            step_seconds: None,
        });
    }
    crate::dry_run::print(
        cli,
        " (inference only: the cache column is the whole batch's)",
        &plans,
    );
    Ok(())
}

/// Figure 6 of the GQA paper: decoding time per sample against the number of K/V groups.
pub struct GqaDecode;

impl Experiment for GqaDecode {
    type Config = DecodeConfig;

    fn check(&self, cli: &Cli, config: &DecodeConfig) -> Result<()> {
        if config.groups.is_empty() || config.repeats == 0 || config.batch == 0 {
            bail!("gqa_fig6 config: groups, repeats and batch must be non-empty / positive");
        }
        if config.encoder_batch == 0 || !config.batch.is_multiple_of(config.encoder_batch) {
            bail!(
                "gqa_fig6 config: encoder_batch ({}) must divide batch ({}); set encoder_batch to 1 or to batch",
                config.encoder_batch,
                config.batch
            );
        }
        for &g in &config.groups {
            config.model(g).validate().map_err(anyhow::Error::msg)?;
        }
        cli.one_device()?;
        Ok(())
    }

    fn plan(&self, cli: &Cli, config: &DecodeConfig, _mode: DryRun) -> Result<()> {
        dry_run(cli, config, &cli.one_device()?.device()?)
    }

    fn execute(&self, cli: &Cli, config: DecodeConfig) -> Result<()> {
        run(cli, &config)
    }

    fn render(&self, out: &Path) -> Result<()> {
        render(out)
    }
}

/// Times the encoder and every model's decoding step, interleaved, and renders.
fn run(cli: &Cli, config: &DecodeConfig) -> Result<()> {
    let device = cli.one_device()?.device()?;
    let provenance = cli.save_provenance(config)?;
    eprintln!(
        "gqa_fig6 ({}): {} on {}",
        cli.profile.name(),
        config.description,
        provenance.device
    );
    let models = models(config, &device);
    let (encoder, encoded, keep) = time_encoder(config, &models[0].1, &device);
    let rounds = time_decoding(config, &models, &encoded, &keep)?;
    write_csv(&cli.out.join("rounds.csv"), &rounds)?;
    // The roofline's ceilings: medians over the rounds, each measured at its round's start, so
    // that they drift with the machine as the steps they bound do.
    let ceiling = |f: fn(&RoundRow) -> f64| median(&mut rounds.iter().map(f).collect::<Vec<f64>>());
    let machine_read_gbps = ceiling(|r| r.machine_read_gbps);
    let machine_gflops = ceiling(|r| r.machine_gflops);
    eprintln!(
        "medians over the rounds: memory read bandwidth {machine_read_gbps:.1} GB/s, matrix-product rate ({0} x {0} x {0}) {machine_gflops:.1} GFLOP/s",
        config.product_size
    );
    let rows: Vec<DecodeRow> = models
        .iter()
        .map(|(groups, model)| {
            let groups = *groups;
            let of = |f: fn(&RoundRow) -> f64| {
                let mut v: Vec<f64> = rounds
                    .iter()
                    .filter(|r| r.groups == groups)
                    .map(f)
                    .collect();
                median(&mut v)
            };
            let cross = of(|r| r.cross_kv_s) / config.encoder_batch as f64;
            let decoder = of(|r| r.decoder_s);
            let per_token = decoder / config.output_length as f64;
            let cost = config.step_cost(groups);
            let (kv, weights) = (cost.kv_bytes, cost.weight_bytes + cost.lm_head_bytes);
            let flops = cost.total_flops();
            let roofline = roofline_seconds(flops, kv + weights, machine_gflops, machine_read_gbps);
            let lm_head = of(|r| r.lm_head_s_per_token);
            let layers_roofline = roofline_seconds(
                cost.flops,
                cost.kv_bytes + cost.weight_bytes,
                machine_gflops,
                machine_read_gbps,
            );
            DecodeRow {
                groups,
                n_heads: config.n_heads,
                batch: config.batch,
                input_length: config.input_length,
                output_length: config.output_length,
                params: burn::module::Module::num_params(model),
                kv_cache_mib: config.cache_bytes(groups) as f64 / (1 << 20) as f64,
                encoder_s_per_sample: encoder,
                cross_kv_s_per_sample: cross,
                decoder_s_per_token: per_token,
                s_per_sample: encoder + cross + decoder / config.batch as f64,
                kv_bytes_per_token: kv,
                weight_bytes_per_token: weights,
                effective_gbps: (kv + weights) / per_token / 1e9,
                machine_read_gbps,
                device: provenance.device.clone(),
                flops_per_token: flops,
                machine_gflops,
                roofline_s_per_token: roofline.unwrap_or(0.0),
                measured_over_roofline: roofline.map_or(0.0, |r| per_token / r),
                lm_head_s_per_token: lm_head,
                layers_s_per_token: of(|r| r.decoder_s_per_token - r.lm_head_s_per_token),
                layers_roofline_s_per_token: layers_roofline.unwrap_or(0.0),
            }
        })
        .collect();
    write_csv(&cli.out.join("decode_time.csv"), &rows)?;
    render(&cli.out)?;
    eprintln!("wrote {}", cli.out.display());
    Ok(())
}

/// One model per group count, all in memory for interleaved timing. They share the first one's
/// embedding, encoder and LM head (the same multi-head parts for every G; burn's tensors are
/// reference-counted, so sharing costs nothing), each with its own decoder, seeded alike.
fn models(config: &DecodeConfig, device: &Device) -> Vec<(usize, T5Model)> {
    let mut models: Vec<(usize, T5Model)> = Vec::new();
    for &groups in &config.groups {
        device.seed(config.seed);
        let mut model = config.model(groups).init(device);
        if let Some((_, first)) = models.first() {
            model.shared = first.shared.clone();
            model.encoder = first.encoder.clone();
            model.lm_head = first.lm_head.clone();
        }
        models.push((groups, model));
    }
    models
}

/// Waits for `t` (lazy backends queue work; reading one element runs it) and drops it.
fn sync<const D: usize>(t: Tensor<D>) {
    let one = t.flatten::<1>(0, D - 1).narrow(0, 0, 1);
    let _ = one.into_data();
}

/// The encoder's median seconds per sample over `warmup + repeats` passes of `encoder_batch`
/// samples, its output and the input mask.
fn time_encoder(
    config: &DecodeConfig,
    model: &T5Model,
    device: &Device,
) -> (f64, Tensor<3>, Tensor<2, Bool>) {
    let ids: Vec<i64> = (0..config.encoder_batch * config.input_length)
        .map(|i| 3 + (i as i64 * 7919 + config.seed as i64) % (config.vocab_size as i64 - 103))
        .collect();
    let inputs = Tensor::<2, Int>::from_data(
        TensorData::new(ids, [config.encoder_batch, config.input_length]),
        device,
    );
    let keep = inputs.clone().greater_elem(-1);
    let mut times = Vec::new();
    let mut encoded = None;
    for i in 0..config.warmup + config.repeats {
        let start = Instant::now();
        let out = model.encode(inputs.clone(), &keep);
        sync(out.clone());
        if i >= config.warmup {
            times.push(start.elapsed().as_secs_f64());
        }
        encoded = Some(out);
    }
    let per_sample = median(&mut times) / config.encoder_batch as f64;
    eprintln!(
        "encoder: {per_sample:.3} s per sample (median of {})",
        config.repeats
    );
    (per_sample, encoded.expect("at least one pass"), keep)
}

/// Interleaved rounds: every G's cross-attention K/V projection (of `encoder_batch` samples) and
/// greedy decoding of the full batch, the first `warmup` rounds untimed.
fn time_decoding(
    config: &DecodeConfig,
    models: &[(usize, T5Model)],
    encoded: &Tensor<3>,
    keep: &Tensor<2, Bool>,
) -> Result<Vec<RoundRow>> {
    let copies = config.batch / config.encoder_batch;
    let total = config.warmup + config.repeats;
    let mut rows = Vec::new();
    let mut progress = Progress::new(total * models.len());
    // The LM head as the decoding steps multiply by it: packed (`T5Model::decoding_weights`).
    let head = PackedWeight::new(models.first().context("no models")?.1.lm_head.weight.val());
    let hidden = Tensor::<2>::random(
        [config.batch, config.d_model],
        burn::tensor::Distribution::Normal(0.0, 1.0),
        &encoded.device(),
    );
    for round in 0..total {
        // This round's roofline ceilings (0: not measured, as configured).
        let machine_read_gbps = if config.bandwidth_bytes > 0 {
            read_bandwidth_gbps(config.bandwidth_bytes, 1)
        } else {
            0.0
        };
        let machine_gflops = if config.product_size > 0 {
            product_gflops(config.product_size, &encoded.device())
        } else {
            0.0
        };
        // The LM head's share of a step (every G shares the head): the batch's hidden states
        // through it, one call per step as in decoding, in the same round as the steps.
        let start = Instant::now();
        for _ in 0..config.output_length {
            sync(head.matmul(hidden.clone()));
        }
        let lm_head_s_per_token = start.elapsed().as_secs_f64() / config.output_length as f64;
        for (groups, model) in models {
            progress.running(format!("round {round}, G = {groups}"));
            // The model's decoding weights, packed (as a server would once, at load time) outside
            // the timed K/V projection and decoding; one model's at a time in memory.
            let weights = model.decoding_weights();
            let start = Instant::now();
            let cache = model.start_decoding_with(weights, encoded, keep);
            let (k, _) = cache.cross_kv.last().context("the decoder has no layers")?;
            sync(k.clone());
            let cross_kv_s = start.elapsed().as_secs_f64();
            let cache = cache.repeat_batch(copies);
            let start = Instant::now();
            let out = model.greedy_decode_cached(cache, config.output_length, Stop::Length);
            let decoder_s = start.elapsed().as_secs_f64();
            debug_assert!(out.iter().all(|s| s.len() == config.output_length));
            let row = RoundRow {
                round: round.saturating_sub(config.warmup),
                groups: *groups,
                cross_kv_s,
                decoder_s,
                decoder_s_per_token: decoder_s / config.output_length as f64,
                lm_head_s_per_token,
                machine_gflops,
                machine_read_gbps,
            };
            let what = if round < config.warmup {
                "warm-up"
            } else {
                "timed"
            };
            progress.item(format!(
                "round {round} ({what}) G = {groups:<3} K/V projection {cross_kv_s:7.3} s, {:8.4} s per decoding step",
                row.decoder_s_per_token
            ));
            if round >= config.warmup {
                rows.push(row);
            }
        }
    }
    Ok(rows)
}

/// The roofline time of a step of `flops` matrix-product FLOPs reading `bytes`: the larger of the
/// two times at this machine's product rate (`gflops`) and read bandwidth (`gbps`); none when
/// either was not measured.
pub fn roofline_seconds(flops: f64, bytes: f64, gflops: f64, gbps: f64) -> Option<f64> {
    (gflops > 0.0 && gbps > 0.0).then(|| (flops / (gflops * 1e9)).max(bytes / (gbps * 1e9)))
}

#[cfg(test)]
mod roofline_tests {
    use super::*;

    fn config() -> DecodeConfig {
        let profile = crate::Profile::Cpu;
        let text = crate::configs::builtin("gqa_fig6", profile).unwrap();
        let table = crate::configs::resolve(text.parse().unwrap(), profile, "gqa_fig6").unwrap();
        toml::Value::Table(table).try_into().unwrap()
    }

    /// The roofline is the slower ceiling, and none without both measurements.
    #[test]
    fn roofline_is_the_slower_ceiling() {
        assert_eq!(roofline_seconds(2e9, 1e9, 100.0, 10.0), Some(0.1));
        assert_eq!(roofline_seconds(4e10, 1e9, 100.0, 10.0), Some(0.4));
        assert_eq!(roofline_seconds(4e10, 1e9, 0.0, 10.0), None);
        assert_eq!(roofline_seconds(4e10, 1e9, 100.0, 0.0), None);
    }

    /// A decoding step's FLOPs by hand at the cpu profile's T5-XXL layer shapes (d 4096, 64 heads
    /// of 64, d_ff 10240, vocabulary 32128, 1 decoder layer, input 2048, output 64, batch 32), for
    /// MHA and MQA: only the K/V projections depend on G.
    #[test]
    fn step_flops_count_every_product() {
        let c = config();
        let (d, ff, vocab, inner) = (4096.0, 10240.0, 32128.0, 4096.0);
        assert_eq!(
            (c.d_model, c.d_ff, c.vocab_size, c.n_heads * c.d_kv),
            (4096, 10240, 32128, 4096)
        );
        let by_hand = |kv: f64| {
            let layer = 4.0 * d * (inner + kv)
                + 4.0 * 32.5 * inner
                + 4.0 * d * inner
                + 4.0 * 2048.0 * inner
                + 6.0 * d * ff;
            32.0 * (layer + 2.0 * d * vocab)
        };
        assert_eq!((c.input_length, c.output_length, c.batch), (2048, 64, 32));
        for (groups, kv) in [(64, 4096.0), (1, 64.0)] {
            let got = c.step_cost(groups).total_flops();
            assert!(
                (got - by_hand(kv)).abs() < 1e-6 * got,
                "G = {groups}: {got}"
            );
        }
    }
}
