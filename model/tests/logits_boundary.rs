//! The logits boundary and activation checkpointing against their references:
//! - chunked log-probs, entropy, loss and every parameter's gradient equal those of full
//!   `[N, V]` logits (fp32, ≤ 1e-5 relative), for an MLA/MoE and a GQA model, at the byte
//!   vocabulary and at Qwen3's 151,936 ids, at temperatures other than 1;
//! - a checkpointed trunk's gradients equal the plain trunk's (≤ 1e-6 relative) with the
//!   cross-layer residual, CLA, token shift and router noise on, and its health and balance
//!   statistics are the same, counted once;
//! - attention within packed documents equals the dense block-diagonal mask, and packed
//!   rows' hidden states equal each document's alone; checkpointing packed rows changes no
//!   gradient;
//! - logits at each row's last appended token equal the full append's.

use std::collections::BTreeMap;
use std::sync::Mutex;

use corvid_model::causal::{causal_sdpa, DocSpans};
use corvid_model::head::{backward_chunked, score_chunked, score_full};
use corvid_model::{
    Attention, AttnGate, Checkpoint, ModelConfig, MoePolicy, ScoreFunc, TokenScores,
    DEFAULT_RECOMPUTE_SLICE_TOKENS,
};
use tch::{nn, Device, Kind, Tensor};

/// libtorch's generator is global: the tests of this file take turns, so that the router
/// noise a seed draws is the same in both runs compared.
static RNG: Mutex<()> = Mutex::new(());

fn mla_cfg(vocab: i64) -> ModelConfig {
    ModelConfig {
        vocab_size: vocab,
        hidden_size: 32,
        num_hidden_layers: 4,
        num_attention_heads: 2,
        kv_lora_rank: 16,
        qk_nope_head_dim: 8,
        qk_rope_head_dim: 8,
        v_head_dim: 8,
        n_routed_experts: 4,
        num_experts_per_tok: 2,
        moe_intermediate_size: 16,
        intermediate_size: 32,
        max_position_embeddings: 128,
        cross_layer_residual: true,
        cla_factor: 2,
        latent_token_shift: true,
        latent_shift_taps: 2,
        first_k_dense_replace: 1,
        ..ModelConfig::tiny()
    }
}

fn gqa_cfg(vocab: i64) -> ModelConfig {
    ModelConfig {
        num_attention_heads: 4,
        attention: Attention::Gqa {
            num_key_value_heads: 2,
            head_dim: 8,
            qk_norm: true,
        },
        attn_gate: AttnGate::None,
        cross_layer_residual: false,
        cla_factor: 1,
        latent_token_shift: false,
        scoring_func: ScoreFunc::Softmax,
        tie_word_embeddings: false,
        ..mla_cfg(vocab)
    }
}

/// A model whose zero-initialised parts (cross-layer mix, token-shift taps, balance bias)
/// are random, so every path carries signal.
fn build(cfg: &ModelConfig, seed: i64) -> (nn::VarStore, MoePolicy) {
    tch::manual_seed(seed);
    let vs = nn::VarStore::new(Device::Cpu);
    let model = MoePolicy::new(&vs.root(), cfg).unwrap();
    tch::no_grad(|| {
        let mut vars: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
        vars.sort_by(|a, b| a.0.cmp(&b.0));
        for (name, mut t) in vars {
            if name.contains("cross_layer")
                || name.contains("e_score_correction_bias")
                || name.contains("shift_proj")
            {
                let r = t.randn_like() * 0.5;
                t.copy_(&r);
            }
        }
    });
    (vs, model)
}

fn grads(vs: &nn::VarStore) -> BTreeMap<String, Tensor> {
    vs.variables()
        .into_iter()
        .filter(|(_, t)| t.requires_grad())
        .map(|(n, t)| {
            let g = t.grad();
            let g = if g.defined() {
                g.copy()
            } else {
                t.zeros_like()
            };
            (n, g)
        })
        .collect()
}

fn zero_grads(vs: &nn::VarStore) {
    for (_, mut t) in vs.variables() {
        let mut g = t.grad();
        if g.defined() {
            let _ = g.zero_();
        }
        let _ = &mut t;
    }
}

/// `‖a − b‖ / ‖b‖` (Frobenius).
fn rel(a: &Tensor, b: &Tensor) -> f64 {
    let a = a.to_kind(Kind::Double);
    let b = b.to_kind(Kind::Double);
    let scale = b.norm().double_value(&[]).max(1e-30);
    (&a - &b).norm().double_value(&[]) / scale
}

fn assert_grads_equal(
    got: &BTreeMap<String, Tensor>,
    want: &BTreeMap<String, Tensor>,
    tol: f64,
    what: &str,
) {
    assert_eq!(got.len(), want.len());
    let mut nonzero = 0;
    for (name, w) in want {
        let g = &got[name];
        if w.abs().max().double_value(&[]) > 0.0 {
            nonzero += 1;
        }
        let r = rel(g, w);
        assert!(
            r <= tol,
            "{what}: gradient of {name} differs by {r:e} relative"
        );
    }
    assert!(nonzero * 2 > want.len(), "{what}: most gradients are zero");
}

/// A per-token loss of the kind RL uses: depends on each token's log-prob and entropy.
/// A loss of every kind of term the trainers use; without `entropy` the entropy has no
/// gradient at all (as in SFT).
fn token_loss(s: &TokenScores, adv_n: &Tensor, entropy: bool) -> Tensor {
    let l = -(&s.logp_n * adv_n) + s.logp_n.exp() * 0.1;
    match entropy {
        true => (l - &s.entropy_n * 0.01).sum(Kind::Float),
        false => l.sum(Kind::Float),
    }
}

#[test]
fn chunked_scores_loss_and_gradients_equal_the_full_logits() {
    let _rng = RNG.lock().unwrap_or_else(|p| p.into_inner());
    tch::set_num_threads(2);
    for (name, cfg) in [
        ("MLA/MoE, byte vocabulary", mla_cfg(264)),
        ("GQA, byte vocabulary", gqa_cfg(264)),
        (
            "MLA/MoE, Qwen3 vocabulary",
            ModelConfig {
                hidden_size: 16,
                ..mla_cfg(151_936)
            },
        ),
        (
            "GQA, Qwen3 vocabulary",
            ModelConfig {
                hidden_size: 16,
                ..gqa_cfg(151_936)
            },
        ),
    ] {
        let (vs, model) = build(&cfg, 3);
        let (b, t) = (2, 24);
        let tokens = Tensor::randint(cfg.vocab_size, [b, t], (Kind::Int64, Device::Cpu));
        let targets = Tensor::randint(cfg.vocab_size, [b * t], (Kind::Int64, Device::Cpu));
        // Temperatures other than 1, varying per token (two trajectories).
        let inv_temp = Tensor::cat(
            &[
                Tensor::full([t, 1], 1.0 / 0.7, (Kind::Float, Device::Cpu)),
                Tensor::full([t, 1], 1.0 / 1.3, (Kind::Float, Device::Cpu)),
            ],
            0,
        );
        let adv = Tensor::randn([b * t], (Kind::Float, Device::Cpu));
        let d = cfg.hidden_size;

        let tol = 1e-5;
        let mut last_full = None;
        for with_entropy in [true, false] {
            // Reference: full logits over every position, one backward.
            zero_grads(&vs);
            let trunk = model.trunk(&tokens, false, Checkpoint::None).unwrap();
            let h = trunk.hidden_btd.view([-1, d]);
            let full = score_full(&h, model.head_weight_vd(), &targets, &inv_temp).unwrap();
            let want_loss = token_loss(&full, &adv, with_entropy);
            want_loss.backward();
            let want = grads(&vs);

            // Chunked: 5 positions at a time (not a divisor of 48), then the trunk's backward.
            zero_grads(&vs);
            let trunk = model.trunk(&tokens, false, Checkpoint::None).unwrap();
            let h = trunk.hidden_btd.view([-1, d]);
            let mut got_loss = 0.0;
            let (scores, grad_nd) = backward_chunked(
                &h,
                model.head_weight_vd(),
                &targets,
                &inv_temp,
                5,
                |r, s| {
                    let l = token_loss(s, &adv.narrow(0, r.start, r.end - r.start), with_entropy);
                    got_loss += l.double_value(&[]);
                    Ok(l)
                },
            )
            .unwrap();
            model
                .backward(trunk, &grad_nd.view([b, t, d]), 0.0)
                .unwrap();
            let got = grads(&vs);

            assert!(
                rel(&scores.logp_n, &full.logp_n.detach()) <= tol,
                "{name}: log-probs"
            );
            assert!(
                rel(&scores.entropy_n, &full.entropy_n.detach()) <= tol,
                "{name}: entropy"
            );
            let w = want_loss.double_value(&[]);
            assert!(
                (got_loss - w).abs() <= tol * w.abs().max(1.0),
                "{name}: loss {got_loss} vs {w}"
            );
            assert_grads_equal(
                &got,
                &want,
                tol,
                &format!("{name}, entropy term {with_entropy}"),
            );
            last_full = Some(full);
        }
        let full = last_full.expect("the loop ran");

        // Scoring without gradients: the same values.
        let trunk = tch::no_grad(|| model.trunk(&tokens, false, Checkpoint::None).unwrap());
        let s = score_chunked(
            &trunk.hidden_btd.view([-1, d]),
            model.head_weight_vd(),
            &targets,
            &inv_temp,
            7,
        )
        .unwrap();
        assert!(
            rel(&s.logp_n, &full.logp_n.detach()) <= tol,
            "{name}: scoring"
        );
        // The temperature matters: at 1 the log-probs differ.
        let ones = Tensor::ones([b * t, 1], (Kind::Float, Device::Cpu));
        let s1 = score_chunked(
            &trunk.hidden_btd.view([-1, d]),
            model.head_weight_vd(),
            &targets,
            &ones,
            7,
        )
        .unwrap();
        assert!(
            rel(&s1.logp_n, &s.logp_n) > 1e-3,
            "{name}: temperature ignored"
        );
    }
}

/// One training step's gradients and statistics with the given checkpointing, on `tokens`
/// (plain causal) or on packed documents.
fn train_step(
    vs: &nn::VarStore,
    model: &MoePolicy,
    tokens: &Tensor,
    packed: Option<(&Tensor, &Tensor)>,
    checkpoint: Checkpoint,
    seed: i64,
) -> (
    BTreeMap<String, Tensor>,
    Vec<corvid_model::MoeHealth>,
    Vec<Vec<f64>>,
    f64,
) {
    zero_grads(vs);
    tch::manual_seed(seed); // the router noise of the forward
    let trunk = match packed {
        None => model.trunk(tokens, true, checkpoint).unwrap(),
        Some((pos, doc)) => model
            .trunk_packed(tokens, pos, doc, true, checkpoint)
            .unwrap(),
    };
    let (b, t, d) = trunk.hidden_btd.size3().unwrap();
    let targets = tokens.roll([-1], [1]).view([-1]);
    let inv_temp = Tensor::ones([b * t, 1], (Kind::Float, Device::Cpu));
    let (_, grad) = backward_chunked(
        &trunk.hidden_btd.view([-1, d]),
        model.head_weight_vd(),
        &targets,
        &inv_temp,
        16,
        |_, s| Ok(-s.logp_n.sum(Kind::Float)),
    )
    .unwrap();
    let health = trunk.health.clone();
    let counts: Vec<Vec<f64>> = trunk
        .balance
        .layers
        .iter()
        .map(|(_, s)| Vec::<f64>::try_from(&s.counts_e).unwrap())
        .collect();
    let aux = trunk.aux_loss.double_value(&[]);
    model.backward(trunk, &grad.view([b, t, d]), 0.5).unwrap();
    (grads(vs), health, counts, aux)
}

#[test]
fn checkpointed_blocks_give_the_same_gradients_and_statistics() {
    let _rng = RNG.lock().unwrap_or_else(|p| p.into_inner());
    tch::set_num_threads(2);
    let with_noise = ModelConfig {
        router_noise_std: 0.3,
        aux_loss_coef: 0.05,
        router_z_loss_coef: 1e-3,
        balance: corvid_model::BalanceMode::AuxLoss,
        ..mla_cfg(264)
    };
    for (name, cfg) in [
        (
            "MLA/MoE, cross-layer residual, CLA 2, token shift, router noise",
            with_noise,
        ),
        ("GQA", gqa_cfg(264)),
    ] {
        let (vs, mut model) = build(&cfg, 5);
        let tokens = Tensor::randint(cfg.vocab_size, [2, 20], (Kind::Int64, Device::Cpu));
        let (want, h_want, c_want, aux_want) =
            train_step(&vs, &model, &tokens, None, Checkpoint::None, 11);
        // The FFN rerun in one slice, then in slices of 7 of the 40 tokens (the last short).
        for slice in [DEFAULT_RECOMPUTE_SLICE_TOKENS, 7] {
            model.set_recompute_slice_tokens(slice);
            let (got, h_got, c_got, aux_got) =
                train_step(&vs, &model, &tokens, None, Checkpoint::Blocks, 11);
            let name = format!("{name}, FFN slices of {slice}");
            assert_grads_equal(&got, &want, 1e-6, &name);
            assert_eq!(h_got, h_want, "{name}: health");
            assert_eq!(c_got, c_want, "{name}: expert counts");
            assert!(
                (aux_got - aux_want).abs() <= 1e-7 * aux_want.abs().max(1.0),
                "{name}: aux"
            );
        }
        if cfg.n_routed_experts > 0 {
            assert!(!h_want.is_empty(), "{name}: health is reported");
        }

        // Packed documents: the same with the document mask (FFN slices of 7).
        let pos = Tensor::cat(
            &[
                Tensor::arange(12, (Kind::Int64, Device::Cpu)),
                Tensor::arange(8, (Kind::Int64, Device::Cpu)),
            ],
            0,
        )
        .unsqueeze(0)
        .expand([2, 20], false)
        .contiguous();
        let doc = Tensor::cat(
            &[
                Tensor::zeros([12], (Kind::Int64, Device::Cpu)),
                Tensor::ones([8], (Kind::Int64, Device::Cpu)),
            ],
            0,
        )
        .unsqueeze(0)
        .expand([2, 20], false)
        .contiguous();
        let (want, ..) = train_step(
            &vs,
            &model,
            &tokens,
            Some((&pos, &doc)),
            Checkpoint::None,
            12,
        );
        let (got, ..) = train_step(
            &vs,
            &model,
            &tokens,
            Some((&pos, &doc)),
            Checkpoint::Blocks,
            12,
        );
        assert_grads_equal(&got, &want, 1e-6, &format!("{name}, packed"));
    }
}

#[test]
fn logits_at_the_last_appended_token_equal_the_full_append() {
    let _rng = RNG.lock().unwrap_or_else(|p| p.into_inner());
    let cfg = mla_cfg(264);
    let (_vs, model) = build(&cfg, 8);
    let tokens = Tensor::randint(cfg.vocab_size, [3, 9], (Kind::Int64, Device::Cpu));
    let new = [9, 4, 1];
    let mut a = model.new_cache(3, 32);
    let mut b = model.new_cache(3, 32);
    let full = model.forward_ragged(&mut a, &tokens, &new).unwrap();
    let last = model.forward_ragged_last(&mut b, &tokens, &new).unwrap();
    assert_eq!(last.size(), [3, cfg.vocab_size]);
    for (row, n) in new.iter().enumerate() {
        let want = full.get(row as i64).get(n - 1);
        let got = last.get(row as i64);
        assert!(
            (got - want).abs().max().double_value(&[]) < 1e-5,
            "row {row}"
        );
    }
    assert_eq!(a.lens(), b.lens());
}

#[test]
fn document_attention_equals_the_dense_block_diagonal_mask() {
    let _rng = RNG.lock().unwrap_or_else(|p| p.into_inner());
    // Two rows: three documents then padding; one document filling the row.
    let doc = Tensor::from_slice(&[
        0i64, 0, 0, 0, 0, 1, 1, 2, 2, 2, 2, -1, -1, //
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ])
    .view([2, 13]);
    let docs = DocSpans::from_doc_ids(&doc).unwrap();
    assert_eq!(docs.rows[0], vec![(0, 5), (5, 2), (7, 4), (11, 2)]);
    assert_eq!(docs.rows[1], vec![(0, 13)]);
    let (q, k, v) = (
        Tensor::randn([2, 3, 13, 16], (Kind::Float, Device::Cpu)),
        Tensor::randn([2, 3, 13, 16], (Kind::Float, Device::Cpu)),
        Tensor::randn([2, 3, 13, 16], (Kind::Float, Device::Cpu)),
    );
    let got = causal_sdpa(&q, &k, &v, 0.25, Some(&docs));
    let mask = docs.dense_mask_b1tt(13, Device::Cpu);
    let want =
        Tensor::scaled_dot_product_attention(&q, &k, &v, Some(&mask), 0.0, false, 0.25, false);
    assert!(rel(&got, &want) < 1e-6, "{}", rel(&got, &want));

    // Through the model: each packed document's hidden states equal its own run's.
    for cfg in [mla_cfg(264), gqa_cfg(264)] {
        let (_vs, model) = build(&cfg, 4);
        let a = Tensor::randint(264, [1, 9], (Kind::Int64, Device::Cpu));
        let b = Tensor::randint(264, [1, 6], (Kind::Int64, Device::Cpu));
        let tokens = Tensor::cat(&[&a, &b], 1);
        let pos = Tensor::cat(
            &[
                Tensor::arange(9, (Kind::Int64, Device::Cpu)),
                Tensor::arange(6, (Kind::Int64, Device::Cpu)),
            ],
            0,
        )
        .unsqueeze(0);
        let ids = Tensor::cat(
            &[
                Tensor::zeros([9], (Kind::Int64, Device::Cpu)),
                Tensor::ones([6], (Kind::Int64, Device::Cpu)),
            ],
            0,
        )
        .unsqueeze(0);
        tch::no_grad(|| {
            let packed = model
                .trunk_packed(&tokens, &pos, &ids, false, Checkpoint::None)
                .unwrap();
            let alone_a = model.trunk(&a, false, Checkpoint::None).unwrap();
            let alone_b = model.trunk(&b, false, Checkpoint::None).unwrap();
            assert!(rel(&packed.hidden_btd.narrow(1, 0, 9), &alone_a.hidden_btd) < 1e-5);
            assert!(rel(&packed.hidden_btd.narrow(1, 9, 6), &alone_b.hidden_btd) < 1e-5);
        });
    }
}
