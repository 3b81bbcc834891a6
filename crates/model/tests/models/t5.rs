//! T5.1.1 with grouped-query attention: bucket test vectors, grouped vs expanded attention, G = H
//! against multi-head, mean conversion of a model whose heads already agree within groups, cache
//! size against G, cached decoding against teacher forcing, a cache repeated over the batch,
//! padding invariance and causality; the fused kernels' model against the plain burn path.

use burn::module::Param;
use burn::prelude::*;
use model::fused;
use model::layers::Direction;
use model::t5::{
    AttentionBias, DecoderCache, KvConversion, Stop, T5Config, T5Model, convert_kv_heads,
    grouped_attention, grouped_attention_reference, padding_bias, pool_kv_heads,
    relative_position_bucket,
};

use crate::common::{
    assert_close, at_every_simd_level, autodiff_device, backward_with, device, grad, param_grads,
    randn, token_tensor, tokens, values,
};

/// First distance of each logarithmic bucket, as Hugging Face's `modeling_t5.py` computes it (T5's
/// `_relative_position_bucket` with 32 buckets, max distance 128).
#[test]
fn relative_position_buckets_match_the_reference_vectors() {
    let decoder = [
        (16, 16),
        (17, 19),
        (18, 21),
        (19, 24),
        (20, 27),
        (21, 31),
        (22, 35),
        (23, 40),
        (24, 46),
        (25, 52),
        (26, 59),
        (27, 67),
        (28, 77),
        (29, 87),
        (30, 99),
        (31, 113),
    ];
    let causal = |d: i64| relative_position_bucket(-d, Direction::Causal, 32, 128);
    for (bucket, first) in decoder {
        assert_eq!(causal(first), bucket, "decoder distance {first}");
        assert_eq!(
            causal(first - 1),
            bucket - 1,
            "decoder distance {}",
            first - 1
        );
    }
    for d in 0..16 {
        assert_eq!(causal(d), d as usize, "exact decoder bucket {d}");
    }
    assert_eq!(causal(10_000), 31, "far past shares the last bucket");
    assert_eq!(
        causal(-5),
        0,
        "future keys fall in bucket 0 (they are masked)"
    );

    let encoder = [
        (9, 12),
        (10, 16),
        (11, 23),
        (12, 32),
        (13, 46),
        (14, 64),
        (15, 91),
    ];
    let bidi = |rel: i64| relative_position_bucket(rel, Direction::Bidirectional, 32, 128);
    for (bucket, first) in encoder {
        assert_eq!(bidi(-first), bucket, "encoder key {first} before");
        assert_eq!(
            bidi(-(first - 1)),
            bucket - 1,
            "encoder key {} before",
            first - 1
        );
        assert_eq!(bidi(first), bucket + 16, "encoder key {first} after");
    }
    for d in 0..8 {
        assert_eq!(bidi(-d), d as usize);
    }
    for d in 1..8 {
        assert_eq!(bidi(d), d as usize + 16);
    }
}

/// A stack's position bias [H, T, S] holds, at (h, q, k), row `bucket(k − (q_start + q))` of its
/// [buckets, H] table, column h (the formula by hand), for the encoder's and the decoder's
/// directions, a whole window and a decoding step's row past the exact buckets; its gradient is
/// the upstream's sum per (bucket, head).
#[test]
fn position_bias_reads_each_offsets_bucket_and_sums_its_gradient() {
    let dev = autodiff_device();
    let cfg = T5Config::tiny();
    let model = cfg.init(&dev);
    let (n, max, h) = (cfg.relative_buckets, cfg.relative_max_distance, cfg.n_heads);
    let cases = [
        (
            &model.encoder.position_bias,
            Direction::Bidirectional,
            (0, 9, 9),
        ),
        (
            &model.encoder.position_bias,
            Direction::Bidirectional,
            (3, 5, 200),
        ),
        (&model.decoder.position_bias, Direction::Causal, (0, 7, 7)),
        (
            &model.decoder.position_bias,
            Direction::Causal,
            (150, 1, 151),
        ),
    ];
    for (i, (stack_bias, direction, (q_start, q_len, k_len))) in cases.into_iter().enumerate() {
        let table = values(stack_bias.embedding.weight.val());
        let bias = stack_bias.forward(q_start, q_len, k_len);
        assert_eq!(bias.dims(), [h, q_len, k_len], "case {i}: shape");
        let upstream = randn([h, q_len, k_len], i as u64, &dev);
        let up = values(upstream.clone());
        let mut want = vec![0f32; h * q_len * k_len];
        let mut want_grad = vec![0f32; n * h];
        for head in 0..h {
            for q in 0..q_len {
                for k in 0..k_len {
                    let rel = k as i64 - (q_start + q) as i64;
                    let bucket = relative_position_bucket(rel, direction, n, max);
                    let at = (head * q_len + q) * k_len + k;
                    want[at] = table[bucket * h + head];
                    want_grad[bucket * h + head] += up[at];
                }
            }
        }
        assert_eq!(values(bias.clone()), want, "case {i}: values");
        let grads = backward_with(bias, &upstream);
        let got = grad(&stack_bias.embedding.weight.val(), &grads);
        assert_close(&got, &want_grad, 1e-5, &format!("case {i}: gradient"));
    }
}
/// Grouped attention on the G heads (the fused kernel on `flex`, and the plain path) equals
/// expanding K/V to H heads, for every G dividing H, with odd lengths, a position bias by offset
/// that differs per head and offset (the kernel reads it by offset, the reference expanded by
/// [`AttentionBias::dense`]), padding per sequence, causal or not.
#[test]
fn grouped_attention_equals_repeated_kv() {
    let dev = device();
    let (b, h, dk) = (2, 8, 4);
    let keep = Tensor::<2, Bool>::from_data(
        TensorData::new(
            (0..14).map(|i| i % 7 < 4 + i / 7).collect::<Vec<_>>(),
            [2, 7],
        ),
        &dev,
    );
    for (t, s, direction) in [(5, 7, Direction::Bidirectional), (7, 7, Direction::Causal)] {
        for g in [1, 2, 4, 8] {
            let q = randn([b, h, t, dk], 1, &dev);
            let k = randn([b, g, s, dk], 2, &dev);
            let v = randn([b, g, s, dk], 3, &dev);
            let bias = AttentionBias {
                position: Some(randn([h, t + s - 1], 4, &dev)),
                direction,
                padding: Some(padding_bias(&keep)),
            };
            let dense = bias.dense(t, s, &dev);
            let what = format!("G = {g}, {direction:?}");
            let reference = values(grouped_attention_reference(
                q.clone(),
                k.clone(),
                v.clone(),
                dense,
            ));
            let run = || {
                values(grouped_attention(
                    q.clone(),
                    k.clone(),
                    v.clone(),
                    &bias,
                    None,
                ))
            };
            assert_close(&run(), &reference, 1e-5, &format!("{what}, fused"));
            let plain = fused::with_reference(run);
            assert_close(&plain, &reference, 1e-5, &format!("{what}, plain"));
        }
    }
}

/// With G = H, grouped attention is ordinary multi-head attention, written out here per head, with
/// query i and key j adding the position bias's column T − 1 − i + j.
#[test]
fn grouped_attention_with_g_equal_h_is_multi_head() {
    let dev = device();
    let (b, h, t, s, dk) = (1, 3, 4, 6, 5);
    let q = randn([b, h, t, dk], 5, &dev);
    let k = randn([b, h, s, dk], 6, &dev);
    let v = randn([b, h, s, dk], 7, &dev);
    let bias = randn([h, t + s - 1], 8, &dev);
    let terms = AttentionBias {
        position: Some(bias.clone()),
        direction: Direction::Bidirectional,
        padding: None,
    };
    let ours = values(grouped_attention(
        q.clone(),
        k.clone(),
        v.clone(),
        &terms,
        None,
    ));
    let (q, k, v, bias) = (values(q), values(k), values(v), values(bias));
    for head in 0..h {
        for i in 0..t {
            let scores: Vec<f32> = (0..s)
                .map(|j| {
                    (0..dk)
                        .map(|c| q[(head * t + i) * dk + c] * k[(head * s + j) * dk + c])
                        .sum::<f32>()
                        + bias[head * (t + s - 1) + t - 1 - i + j]
                })
                .collect();
            let max = scores.iter().fold(f32::MIN, |m, &x| m.max(x));
            let e: Vec<f32> = scores.iter().map(|x| (x - max).exp()).collect();
            let z: f32 = e.iter().sum();
            for c in 0..dk {
                let expected: f32 = (0..s).map(|j| e[j] / z * v[(head * s + j) * dk + c]).sum();
                let got = ours[(head * t + i) * dk + c];
                assert!(
                    (got - expected).abs() < 1e-5,
                    "head {head} query {i} channel {c}: {got} vs {expected}"
                );
            }
        }
    }
}

fn tiny(n_kv_heads: usize) -> T5Model {
    T5Config::tiny().with_n_kv_heads(n_kv_heads).init(&device())
}

struct Batch {
    inputs: Tensor<2, Int>,
    keep: Tensor<2, Bool>,
    targets: Tensor<2, Int>,
}

/// Two sequences of 7 input tokens (the second padded after 5) and 6 targets, ids ≥ 3.
fn batch(seed: u64) -> Batch {
    let dev = device();
    let vocab = T5Config::tiny().vocab_size;
    let mut ids: Vec<i64> = tokens(seed, 2, 7, vocab - 3)
        .iter()
        .map(|t| t + 3)
        .collect();
    ids[12] = 0;
    ids[13] = 0;
    let keep: Vec<bool> = ids.iter().map(|&t| t != 0).collect();
    let targets: Vec<i64> = tokens(seed + 1, 2, 6, vocab - 3)
        .iter()
        .map(|t| t + 3)
        .collect();
    Batch {
        inputs: token_tensor(&ids, 2, &dev),
        keep: Tensor::from_data(TensorData::new(keep, [2, 7]), &dev),
        targets: token_tensor(&targets, 2, &dev),
    }
}

fn logits(model: &T5Model, b: &Batch) -> Vec<f32> {
    values(model.forward(b.inputs.clone(), &b.keep, b.targets.clone()))
}

/// Converting an MHA model to G = H groups changes nothing (each group is one head).
#[test]
fn conversion_to_h_groups_is_the_identity() {
    let model = tiny(4);
    let b = batch(1);
    let before = logits(&model, &b);
    let converted = convert_kv_heads(model, 4, KvConversion::Mean).unwrap();
    assert_eq!(before, logits(&converted, &b));
}

/// Copies head `first` of each group over the group's other heads in a K/V projection [d, H·dk].
fn make_groups_identical(weight: Tensor<2>, h: usize, g: usize) -> Tensor<2> {
    let [d, w] = weight.dims();
    let dk = w / h;
    weight
        .reshape([d, g, h / g, dk])
        .narrow(2, 0, 1)
        .expand([d, g, h / g, dk])
        .reshape([d, w])
}

/// A multi-head model whose K/V heads are already identical within each group is unchanged by mean
/// conversion to those groups (and by first-head conversion), while random conversion changes it.
#[test]
fn mean_conversion_keeps_a_model_with_identical_heads_per_group() {
    let (h, g) = (4, 2);
    let mut model = tiny(h);
    for layer in &mut model.decoder.layers {
        let cross = layer.cross.as_mut().unwrap();
        for attention in [&mut layer.self_attention, &mut cross.attention] {
            for linear in [&mut attention.k, &mut attention.v] {
                let w = make_groups_identical(linear.weight.val(), h, g);
                linear.weight = Param::from_tensor(w);
            }
        }
    }
    let b = batch(2);
    let before = logits(&model, &b);
    let mean = convert_kv_heads(model.clone(), g, KvConversion::Mean).unwrap();
    assert_eq!(mean.n_kv_heads(), g);
    assert_close(&logits(&mean, &b), &before, 1e-5, "mean conversion");
    let first = convert_kv_heads(model.clone(), g, KvConversion::First).unwrap();
    assert_close(&logits(&first, &b), &before, 1e-5, "first-head conversion");
    let random = convert_kv_heads(model, g, KvConversion::Random).unwrap();
    let diff = crate::common::max_rel_diff(&logits(&random, &b), &before);
    assert!(
        diff > 1e-3,
        "random conversion left the logits unchanged ({diff})"
    );
}

/// Mean pooling averages the heads of each contiguous group: head h lands in group h / (H/G).
#[test]
fn mean_pooling_groups_heads_contiguously() {
    let dev = device();
    // d = 1, H = 4, dk = 1: the weight row is the heads' values.
    let w = Tensor::<2>::from_data(TensorData::new(vec![1.0f32, 3.0, 10.0, 20.0], [1, 4]), &dev);
    let pooled = values(pool_kv_heads(w.clone(), 4, 2, KvConversion::Mean));
    assert_eq!(pooled, [2.0, 15.0]);
    let first = values(pool_kv_heads(w, 4, 2, KvConversion::First));
    assert_eq!(first, [1.0, 10.0]);
}

#[test]
fn conversion_rejects_bad_groups_and_converted_models() {
    let model = tiny(4);
    assert!(convert_kv_heads(model.clone(), 3, KvConversion::Mean).is_err());
    assert!(convert_kv_heads(model.clone(), 0, KvConversion::Mean).is_err());
    let mqa = convert_kv_heads(model, 1, KvConversion::Mean).unwrap();
    assert!(convert_kv_heads(mqa, 1, KvConversion::Mean).is_err());
    assert!(T5Config::tiny().with_n_kv_heads(3).validate().is_err());
}

/// Runs `steps` cached decoding steps feeding `feed`, returning the cache and each step's logits.
fn cached_logits(model: &T5Model, b: &Batch, feed: &Tensor<2, Int>) -> (DecoderCache, Vec<f32>) {
    let encoded = model.encode(b.inputs.clone(), &b.keep);
    let mut cache = model.start_decoding(&encoded, &b.keep);
    let t = feed.dims()[1];
    let steps: Vec<Tensor<3>> = (0..t)
        .map(|i| model.decode_step(feed.clone().narrow(1, i, 1), &mut cache))
        .collect();
    (cache, values(Tensor::cat(steps, 1)))
}

/// The cache holds G heads: its size is exactly G/H of the multi-head cache, for MHA, GQA-2, MQA.
#[test]
fn kv_cache_size_scales_with_groups() {
    let b = batch(3);
    let feed = model::t5::shift_right(b.targets.clone());
    let mha = tiny(4);
    let (cache, _) = cached_logits(&mha, &b, &feed);
    let full = cache.elements();
    // 2 layers × (self: 6 positions + cross: 7 positions) × K and V × B 2 × H 4 × dk 8.
    assert_eq!(full, 2 * (6 + 7) * 2 * 2 * 4 * 8);
    for g in [2, 1] {
        let model = convert_kv_heads(mha.clone(), g, KvConversion::Mean).unwrap();
        let (cache, _) = cached_logits(&model, &b, &feed);
        assert_eq!(cache.elements() * 4, full * g, "G = {g}");
    }
}

/// Cached step-by-step decoding (its products against the packed weights, `fused::packed`) gives
/// the teacher-forced logits (the modules' own weights through gemm), for MHA, GQA and MQA, at
/// every SIMD level (the scalar level's steps fall back to the modules' path).
#[test]
fn cached_decoding_equals_teacher_forcing() {
    at_every_simd_level(|| {
        for g in [4, 2, 1] {
            let model = tiny(g);
            let b = batch(4);
            let feed = model::t5::shift_right(b.targets.clone());
            let (cache, cached) = cached_logits(&model, &b, &feed);
            // Packed where the fused kernels run (not under `REPRO_KERNELS=reference`).
            let fused_here = model::fused::available(&device());
            assert_eq!(
                cache.weights.is_packed(),
                fused_here,
                "packed decoding weights"
            );
            assert_close(&cached, &logits(&model, &b), 1e-5, &format!("G = {g}"));
        }
    });
}

/// Decoding past the cache's first allocation (it grows by doubling, each step writing one
/// position in place) gives the teacher-forced logits at every one of 150 positions — longer than
/// the relative-position buckets' exact range — on the fused kernels and on the plain path, for
/// MHA, GQA and MQA; weights perturbed so that attention is not near uniform.
#[test]
fn long_cached_decoding_equals_teacher_forcing_past_the_cache_allocation() {
    let dev = device();
    let t = 2 * model::t5::DECODER_CACHE_POSITIONS + 22;
    let b = batch(9);
    let vocab = T5Config::tiny().vocab_size;
    let ids: Vec<i64> = tokens(31, 2, t, vocab - 3).iter().map(|x| x + 3).collect();
    let feed = token_tensor(&ids, 2, &dev);
    for g in [4, 2, 1] {
        let model = model::testing::perturb(tiny(g), 0.3, &dev, 7);
        let run = || {
            let (cache, cached) = cached_logits(&model, &b, &feed);
            let encoded = model.encode(b.inputs.clone(), &b.keep);
            let forced = values(model.decode(feed.clone(), &encoded, &b.keep));
            (cache, cached, forced)
        };
        let what = format!("G = {g}");
        let (cache, cached, forced) = run();
        assert_eq!(cache.position, t);
        let allocated = cache.self_kv[0].as_ref().expect("cache").0.dims()[2];
        assert!(allocated >= t && allocated > model::t5::DECODER_CACHE_POSITIONS);
        assert_close(&cached, &forced, 1e-4, &format!("{what}, fused"));
        let (_, cached, forced) = fused::with_reference(run);
        assert_close(&cached, &forced, 1e-4, &format!("{what}, plain"));
    }
}

/// Greedy decoding returns, at each step, the argmax of the teacher-forced logits of its own output.
#[test]
fn greedy_decoding_is_consistent_with_teacher_forcing() {
    let model = tiny(2);
    let b = batch(5);
    let out = model.greedy_decode(b.inputs.clone(), &b.keep, 5, Stop::Eos);
    let fixed = model.greedy_decode(b.inputs.clone(), &b.keep, 5, Stop::Length);
    assert!(fixed.iter().all(|s| s.len() == 5));
    let vocab = T5Config::tiny().vocab_size;
    for (row, seq) in out.iter().enumerate() {
        assert!(!seq.is_empty() && seq.len() <= 5);
        let inputs = b.inputs.clone().narrow(0, row, 1);
        let keep = b.keep.clone().narrow(0, row, 1);
        let targets = token_tensor(seq, 1, &device());
        let l = values(model.forward(inputs, &keep, targets));
        for (i, &token) in seq.iter().enumerate() {
            let step = &l[i * vocab..(i + 1) * vocab];
            let best = (0..vocab).fold(0, |m, j| if step[j] > step[m] { j } else { m });
            assert_eq!(best as i64, token, "row {row} step {i}");
        }
    }
}

/// Padding inputs: appending pad tokens (masked) leaves the decoder's logits unchanged.
#[test]
fn encoder_padding_is_invisible() {
    let model = tiny(2);
    let b = batch(6);
    let dev = device();
    let pad = |x: Tensor<2, Int>| Tensor::cat(vec![x, Tensor::<2, Int>::zeros([2, 3], &dev)], 1);
    let masked = Tensor::<2, Bool>::from_data(TensorData::new(vec![false; 6], [2, 3]), &dev);
    let keep = Tensor::cat(vec![b.keep.clone(), masked], 1);
    let padded = Batch {
        inputs: pad(b.inputs.clone()),
        keep,
        targets: b.targets.clone(),
    };
    assert_close(
        &logits(&model, &padded),
        &logits(&model, &b),
        1e-5,
        "padded inputs",
    );
    let bias = values(padding_bias(&padded.keep));
    assert!(bias[7..10].iter().all(|&x| x < -1e8));
    assert!(bias[..5].iter().all(|&x| x == 0.0));
}

/// The decoder is causal: changing target j changes no logits before position j + 1.
#[test]
fn decoder_has_no_causal_leakage() {
    let model = tiny(2);
    let b = batch(7);
    let base = logits(&model, &b);
    let vocab = T5Config::tiny().vocab_size;
    let mut ids = values(b.targets.clone().float());
    ids[3] = (ids[3] as i64 % 50 + 60) as f32; // row 0, target 3 → decoder input 4
    let changed: Vec<i64> = ids.iter().map(|&x| x as i64).collect();
    let other = Batch {
        targets: token_tensor(&changed, 2, &device()),
        ..b
    };
    let after = logits(&model, &other);
    let visible = 4 * vocab; // row 0, positions 0..=3
    assert_close(
        &after[..visible],
        &base[..visible],
        1e-6,
        "positions before the change",
    );
    let diff = crate::common::max_rel_diff(&after[visible..6 * vocab], &base[visible..6 * vocab]);
    assert!(
        diff > 1e-4,
        "positions after the change did not move ({diff})"
    );
    assert_close(
        &after[6 * vocab..],
        &base[6 * vocab..],
        1e-6,
        "the other row",
    );
}

/// The analytic FLOP count: 2 FLOPs per weight per token that passes through it (counted from the
/// initialised model, norms excluded), plus QKᵀ and AV by hand.
#[test]
fn forward_flops_count_every_weight_and_the_attention_products() {
    use burn::module::Module;
    let c = T5Config::tiny().with_n_kv_heads(2);
    let m = c.init(&device());
    let d = c.d_model;
    let enc: usize = m
        .encoder
        .layers
        .iter()
        .map(|l| l.num_params() - 2 * d)
        .sum();
    let dec: usize = m
        .decoder
        .layers
        .iter()
        .map(|l| l.num_params() - 3 * d)
        .sum();
    let cross_kv: usize = m
        .decoder
        .layers
        .iter()
        .map(|l| {
            let a = &l.cross.as_ref().unwrap().attention;
            a.k.num_params() + a.v.num_params()
        })
        .sum();
    let head = m.lm_head.num_params();
    let (s, t) = (7usize, 5usize);
    let inner = (c.n_heads * c.d_kv) as f64;
    let dense = 2.0 * (enc * s + (dec - cross_kv) * t + cross_kv * s + head * t) as f64;
    let attention = c.n_encoder_layers as f64 * s as f64 * 4.0 * s as f64 * inner
        + c.n_decoder_layers as f64 * t as f64 * 4.0 * (t + s) as f64 * inner;
    let ours = c.forward_flops(3, s, t);
    assert!(
        (ours - 3.0 * (dense + attention)).abs() < 1e-9 * ours,
        "{ours} vs {}",
        3.0 * (dense + attention)
    );
    let encoder = 2.0 * (enc * s) as f64 + c.n_encoder_layers as f64 * (s * s) as f64 * 4.0 * inner;
    let ours = c.encoder_flops(3, s);
    assert!(
        (ours - 3.0 * encoder).abs() < 1e-9 * ours,
        "encoder: {ours}"
    );
}

/// A cached decoding step's cost from the initialised model: 2 FLOPs per weight per sequence (the
/// decoder layers' weights but cross-attention's K and V, norms excluded), the scores over the
/// decoded and the input positions by hand, every such weight read once (f32), and the cached K/V
/// of every position; the LM head apart.
#[test]
fn decode_step_cost_counts_the_weights_and_the_cache_it_reads() {
    use burn::module::Module;
    let c = T5Config::tiny().with_n_kv_heads(2);
    let m = c.init(&device());
    let d = c.d_model;
    let weights: usize = m
        .decoder
        .layers
        .iter()
        .map(|l| {
            let a = &l.cross.as_ref().unwrap().attention;
            l.num_params() - 3 * d - a.k.num_params() - a.v.num_params()
        })
        .sum();
    let (b, input, positions) = (3usize, 7usize, 4.5);
    let inner = (c.n_heads * c.d_kv) as f64;
    let kv_width = (c.n_kv_heads * c.d_kv) as f64;
    let layers = c.n_decoder_layers as f64;
    let scores = layers * 4.0 * (positions + input as f64) * inner;
    let cost = c.decode_step_cost(b, input, positions);
    let close = |got: f64, want: f64, what: &str| {
        assert!((got - want).abs() < 1e-9 * want, "{what}: {got} vs {want}")
    };
    close(
        cost.flops,
        b as f64 * (2.0 * weights as f64 + scores),
        "FLOPs",
    );
    close(cost.weight_bytes, 4.0 * weights as f64, "weight bytes");
    let kv = layers * b as f64 * 2.0 * kv_width * (input as f64 + positions) * 4.0;
    close(cost.kv_bytes, kv, "K/V bytes");
    let head = m.lm_head.num_params() as f64;
    close(cost.lm_head_flops, 2.0 * b as f64 * head, "LM head FLOPs");
    close(cost.lm_head_bytes, 4.0 * head, "LM head bytes");
    close(
        cost.total_bytes(),
        4.0 * (weights as f64 + head) + kv,
        "total bytes",
    );
}

/// Converting on the training device gives K/V projections that are new leaves and train.
#[test]
fn converted_kv_projections_train_on_the_autodiff_device() {
    let dev = crate::common::autodiff_device();
    let model = T5Config::tiny().init(&dev);
    let model = convert_kv_heads(model, 2, KvConversion::Mean).unwrap();
    let b = batch(8);
    let on = |t: Tensor<2, Int>| Tensor::<2, Int>::from_data(t.into_data(), &dev);
    let keep = Tensor::<2, Bool>::from_data(b.keep.clone().into_data(), &dev);
    let loss = model.loss(on(b.inputs.clone()), &keep, on(b.targets.clone()));
    let grads = loss.backward();
    let k = &model.decoder.layers[0].self_attention.k.weight;
    let g = k
        .val()
        .grad(&grads)
        .expect("pooled K weight has a gradient");
    assert_eq!(g.dims(), [32, 2 * 8]);
    assert!(values(g).iter().any(|x| *x != 0.0));
}

/// A cache repeated over the batch decodes as the repeated inputs do: the same logits at every
/// step (what `gqa_fig6` relies on to decode a large batch from one encoded sample).
#[test]
fn repeated_cache_decodes_as_repeated_inputs() {
    let model = tiny(2);
    let b = batch(11);
    let encoded = model.encode(b.inputs.clone(), &b.keep);
    let mut repeated = model.start_decoding(&encoded, &b.keep).repeat_batch(3);
    let inputs = b.inputs.clone().repeat_dim(0, 3);
    let keep = b.keep.clone().repeat_dim(0, 3);
    let mut direct = model.start_decoding(&model.encode(inputs, &keep), &keep);
    // Feed the targets (three copies) one position at a time to both caches.
    let feed = b.targets.clone().repeat_dim(0, 3);
    for t in 0..4 {
        let tokens = feed.clone().narrow(1, t, 1);
        let a = values(model.decode_step(tokens.clone(), &mut repeated));
        let d = values(model.decode_step(tokens, &mut direct));
        assert_close(&a, &d, 1e-5, &format!("step {t}"));
    }
    // The copies differ from each other only by sample, and a wrong tiling would mix them.
    let r = model.greedy_decode_cached(
        model.start_decoding(&encoded, &b.keep).repeat_batch(2),
        4,
        Stop::Length,
    );
    let once = model.greedy_decode(b.inputs.clone(), &b.keep, 4, Stop::Length);
    assert_eq!(r[..2], once[..]);
    assert_eq!(r[2..], once[..]);
}

/// The T5 training loss and every parameter's gradient on the fused kernels (`flex` autodiff)
/// equal the plain burn path's (`fused::with_reference`), for MHA, GQA and MQA, at every SIMD
/// level; and the logits of a forward on plain `flex` equal the reference's. Weights perturbed so
/// that every path carries signal (a fresh T5 starts with small outputs).
#[test]
fn fused_t5_matches_the_reference_loss_logits_and_every_gradient() {
    at_every_simd_level(fused_t5_matches_the_reference_at_this_level);
}

fn fused_t5_matches_the_reference_at_this_level() {
    let dev = autodiff_device();
    let b = batch(21);
    let on = |t: &Tensor<2, Int>| Tensor::<2, Int>::from_data(t.clone().into_data(), &dev);
    let keep = Tensor::<2, Bool>::from_data(b.keep.clone().into_data(), &dev);
    for g in [4, 2, 1] {
        let model = T5Config::tiny().with_n_kv_heads(g).init(&dev);
        let model = model::testing::perturb(model, 0.3, &dev, 5);
        let run = || {
            let loss = model.loss(on(&b.inputs), &keep, on(&b.targets));
            let grads = loss.backward();
            (values(loss), param_grads(&model, &grads))
        };
        let (loss, grads) = run();
        let (ref_loss, ref_grads) = fused::with_reference(run);
        let what = format!("G = {g}");
        assert_close(&loss, &ref_loss, 1e-5, &format!("{what}: loss"));
        assert_eq!(grads.len(), ref_grads.len());
        for (i, (a, r)) in grads.iter().zip(&ref_grads).enumerate() {
            let (a, r) = (a.as_ref(), r.as_ref());
            let (a, r) = a
                .zip(r)
                .unwrap_or_else(|| panic!("{what}: parameter {i} has no gradient"));
            // Rounding only: the fused softmax's exponential (`fast_exp`, 2e-7) and its order of
            // adding the position and padding terms, through two perturbed layers; a wrong mask,
            // head or group moves gradients by O(1).
            assert_close(a, r, 5e-4, &format!("{what}: gradient of parameter {i}"));
        }
        let plain = model.valid();
        let ref_logits = fused::with_reference(|| logits(&plain, &b));
        assert_close(
            &logits(&plain, &b),
            &ref_logits,
            1e-4,
            &format!("{what}: logits"),
        );
    }
}
