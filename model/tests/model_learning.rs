//! Learning behaviour: balancing a deliberately skewed router (quantile balancing, the
//! aux-free bias rule, the Switch aux loss) and the `tiny` preset overfitting a small corpus.

use corvid_model::balance::{
    histogram_range, needed_bias_histogram, switch_aux_loss, updated_bias, LayerBalanceStats,
    QB_BINS,
};
use corvid_model::health::max_vio;
use corvid_model::router::Router;
use corvid_model::{BalanceMode, ModelConfig, MoePolicy, ScoreFunc};
use corvid_tokenizer::{render_chat, ByteTokenizer, Message, Role};
use tch::nn::OptimizerConfig;
use tch::{nn, Device, Kind, Tensor};

const E: i64 = 16;
const K: i64 = 2;

fn router_cfg() -> ModelConfig {
    ModelConfig {
        hidden_size: 32,
        n_routed_experts: E,
        num_experts_per_tok: K,
        scoring_func: ScoreFunc::Sigmoid,
        ..ModelConfig::tiny()
    }
}

/// A router whose first 4 experts win almost every token, and the tokens it routes.
fn skewed_router(vs: &nn::VarStore) -> (Router, Tensor) {
    tch::manual_seed(0);
    let router = Router::new(vs.root() / "gate", &router_cfg());
    tch::no_grad(|| {
        let mut w = vs.variables()["gate.weight"].shallow_clone();
        let skew = Tensor::zeros([E, 1], (Kind::Float, Device::Cpu));
        let _ = skew.narrow(0, 0, 4).fill_(0.1);
        let _ = w.g_add_(&skew);
    });
    let x_td = Tensor::randn([4096, 32], (Kind::Float, Device::Cpu)) * 0.5 + 1.0;
    (router, x_td)
}

fn counts(router: &Router, x_td: &Tensor) -> Vec<f64> {
    let r = router.forward(x_td, false);
    let c = r
        .idx_tk
        .reshape([-1])
        .bincount(None::<Tensor>, E)
        .to_kind(Kind::Double);
    Vec::<f64>::try_from(c).unwrap()
}

fn bias_step(router: &mut Router, x_td: &Tensor, mode: BalanceMode, rate: f64) {
    let r = router.forward(x_td, true);
    let bias = Vec::<f64>::try_from(router.bias_e.to_kind(Kind::Double)).unwrap();
    let (lo, hi) = histogram_range(&bias);
    let stats = LayerBalanceStats {
        counts_e: r
            .idx_tk
            .reshape([-1])
            .bincount(None::<Tensor>, E)
            .to_kind(Kind::Double),
        hist_eb: Some(needed_bias_histogram(
            &r.scores_te,
            &r.cutoff_t,
            lo,
            hi,
            QB_BINS,
        )),
        lo,
        hi,
        top_k: K,
    };
    let new = updated_bias(mode, &bias, &stats, rate).unwrap();
    tch::no_grad(|| {
        router
            .bias_e
            .copy_(&Tensor::from_slice(&new).to_kind(Kind::Float))
    });
}

#[test]
fn balancing_reduces_max_vio_on_a_skewed_router() {
    tch::set_num_threads(2);
    const STEPS: usize = 40;

    let vs = nn::VarStore::new(Device::Cpu);
    let (mut router, x) = skewed_router(&vs);
    let start = max_vio(&counts(&router, &x));
    assert!(start > 1.0, "the router is not skewed (MaxVio {start})");
    for _ in 0..STEPS {
        bias_step(&mut router, &x, BalanceMode::Quantile, 0.0);
    }
    let quantile = max_vio(&counts(&router, &x));

    let vs = nn::VarStore::new(Device::Cpu);
    let (mut router, x) = skewed_router(&vs);
    for _ in 0..STEPS {
        bias_step(&mut router, &x, BalanceMode::AuxFree, 0.01);
    }
    let aux_free = max_vio(&counts(&router, &x));

    let vs = nn::VarStore::new(Device::Cpu);
    let (router, x) = skewed_router(&vs);
    let mut opt = nn::Adam::default().build(&vs, 0.005).unwrap();
    for _ in 0..STEPS {
        let r = router.forward(&x, true);
        opt.backward_step(&switch_aux_loss(&r.scores_te, &r.idx_tk));
    }
    let aux_loss = max_vio(&counts(&router, &x));

    eprintln!(
        "MaxVio after {STEPS} steps from {start:.3}: quantile {quantile:.3}, \
         aux-free bias (γ=0.01) {aux_free:.3}, Switch aux loss (Adam 5e-3) {aux_loss:.3}"
    );
    assert!(
        quantile < 0.2,
        "quantile balancing left MaxVio at {quantile}"
    );
    assert!(
        aux_free < start,
        "the aux-free bias rule did not reduce MaxVio ({aux_free})"
    );
    assert!(
        aux_loss < start,
        "the aux loss did not reduce MaxVio ({aux_loss})"
    );
}

fn corpus(tok: &ByteTokenizer) -> Vec<Vec<u32>> {
    let files = ["k4/yixz.txt", "a1/qq7.txt", "m9/zzk3.txt", "b2/pl0a.txt"];
    files
        .iter()
        .enumerate()
        .map(|(i, path)| {
            let value = 10_000 + 7_919 * i;
            let chat = render_chat(
                tok,
                &[
                    Message::new(Role::User, format!("Find the value. Start at {path}.")),
                    Message::new(
                        Role::Assistant,
                        format!("<tool_call>{{\"name\":\"read_file\",\"arguments\":{{\"path\":\"{path}\"}}}}</tool_call>"),
                    ),
                    Message::new(Role::Tool, format!("value: {value}")),
                    Message::new(Role::Assistant, format!("<answer>{value}</answer>")),
                ],
            );
            chat.ids
        })
        .collect()
}

#[test]
fn tiny_preset_overfits_a_small_corpus() {
    tch::set_num_threads(2);
    tch::manual_seed(0);
    let tok = ByteTokenizer::new();
    let seqs = corpus(&tok);
    let t = seqs.iter().map(|s| s.len()).max().unwrap() as i64;
    let pad = i64::from(corvid_tokenizer::Special::Pad.id());
    let rows: Vec<Tensor> = seqs
        .iter()
        .map(|s| {
            let mut v: Vec<i64> = s.iter().map(|&i| i64::from(i)).collect();
            v.resize(t as usize, pad);
            Tensor::from_slice(&v)
        })
        .collect();
    let batch_bt = Tensor::stack(&rows, 0);
    let (inputs, targets) = (batch_bt.narrow(1, 0, t - 1), batch_bt.narrow(1, 1, t - 1));

    let cfg = ModelConfig::tiny();
    let vs = nn::VarStore::new(Device::Cpu);
    let mut model = MoePolicy::new(&vs.root(), &cfg).unwrap();
    let mut opt = nn::AdamW::default().build(&vs, 3e-3).unwrap();
    let mut losses = Vec::new();
    for _ in 0..100 {
        let out = model.forward(&inputs, true).unwrap();
        let logp = MoePolicy::token_logprobs(&out.logits_btv, &targets, 1.0).unwrap();
        let loss = -logp.mean(Kind::Float) + &out.aux_loss;
        opt.backward_step(&loss);
        model.update_balance(&out.balance).unwrap();
        losses.push(loss.double_value(&[]));
    }
    let (first, last) = (losses[0], *losses.last().unwrap());
    eprintln!(
        "tiny overfit: loss {first:.3} -> {last:.3} over {} steps",
        losses.len()
    );
    assert!(last < 0.25 * first, "loss only fell from {first} to {last}");
}
