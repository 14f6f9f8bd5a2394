//! Hugging Face checkpoints against transformers, fixture by fixture
//! (`tests/fixtures/hf/<variant>/`, written by `scripts/hf_fixtures.py` with the transformers
//! version pinned in `scripts/bootstrap.sh`; its README says what each holds):
//! - the logits of a batch equal transformers' in fp32 (max abs error ≤ 1e-4 of their scale);
//! - cached decoding (prefill then one token at a time, and a ragged batch) equals the full
//!   forward;
//! - 32 greedy tokens equal transformers' `generate(do_sample=False)` token for token;
//! - one training step's loss and gradient norm equal transformers' (≤ 1e-4 relative);
//! - bad folders (unknown `model_type`, an unsupported key or value, a missing, misshaped or
//!   extra tensor, a shard the index names but the folder lacks, a truncated shard) are
//!   refused with an error naming the file and the key or tensor.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use corvid_model::arch::{self, Family};
use corvid_model::{AttnGate, ModelConfig, ModelError, MoePolicy, RopeScaling};
use tch::{nn, Device, Kind, Reduction, Tensor};

/// Every fixture and its architecture.
const FIXTURES: &[(&str, Family)] = &[
    ("deepseek_v3_qlora", Family::DeepseekV3),
    ("deepseek_v3_plain_yarn", Family::DeepseekV3),
    ("deepseek_v3_bf16", Family::DeepseekV3),
    ("deepseek_v3_fp8", Family::DeepseekV3),
    ("qwen3_moe", Family::Qwen3Moe),
    ("qwen3_moe_sparse_step", Family::Qwen3Moe),
    ("qwen3_moe_byte_vocab", Family::Qwen3Moe),
    ("qwen3", Family::Qwen3),
    ("qwen3_tied_yarn", Family::Qwen3),
];

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hf")
        .join(name)
}

fn expected(name: &str) -> BTreeMap<String, Tensor> {
    Tensor::read_safetensors(fixture(name).join("expected.safetensors"))
        .expect("expected.safetensors reads")
        .into_iter()
        .collect()
}

fn load(name: &str) -> (nn::VarStore, MoePolicy) {
    tch::set_num_threads(1);
    let (vs, model, hf, _) =
        arch::load(&fixture(name), Device::Cpu).unwrap_or_else(|e| panic!("{name} loads: {e}"));
    let family = FIXTURES.iter().find(|(n, _)| *n == name).map(|(_, f)| *f);
    assert_eq!(Some(hf.family), family, "{name}");
    (vs, model)
}

fn max_abs(a: &Tensor, b: &Tensor) -> f64 {
    (a.to_kind(Kind::Double) - b.to_kind(Kind::Double))
        .abs()
        .max()
        .double_value(&[])
}

fn scale(t: &Tensor) -> f64 {
    t.abs().max().double_value(&[]).max(1.0)
}

#[test]
fn logits_equal_transformers() {
    for (name, _) in FIXTURES {
        let (_vs, model) = load(name);
        let want = expected(name);
        let ids = &want["input_ids"];
        let got = model.forward(ids, false).unwrap().logits_btv;
        let err = max_abs(&got, &want["logits"]);
        let tol = 1e-4 * scale(&want["logits"]);
        println!("{name}: max |Δlogits| = {err:.3e} (tolerance {tol:.3e})");
        assert!(err <= tol, "{name}: logits differ by {err} > {tol}");
    }
}

#[test]
fn cached_decoding_equals_the_full_forward() {
    for (name, _) in FIXTURES {
        let (_vs, model) = load(name);
        let ids = &expected(name)["input_ids"];
        let (b, t) = ids.size2().unwrap();
        let full = model.forward(ids, false).unwrap().logits_btv;
        let tol = 1e-4 * scale(&full);
        // Prefill half, then one token at a time.
        let mut cache = model.new_cache(b as usize, t);
        let half = t / 2;
        let mut steps = vec![model
            .forward_cached(&mut cache, &ids.narrow(1, 0, half))
            .unwrap()];
        for i in half..t {
            steps.push(
                model
                    .forward_cached(&mut cache, &ids.narrow(1, i, 1))
                    .unwrap(),
            );
        }
        let err = max_abs(&Tensor::cat(&steps, 1), &full);
        assert!(err <= tol, "{name}: prefill + decode differs by {err}");
        // Ragged: row 0 appends 5 then 11 tokens, row 1 appends 9 then 7.
        let mut cache = model.new_cache(b as usize, t);
        let first = [5i64, 9];
        let a = model
            .forward_ragged(&mut cache, &ids.narrow(1, 0, 9), &first)
            .unwrap();
        let mut rest = Vec::new();
        for (row, &n) in first.iter().enumerate() {
            rest.push(ids.get(row as i64).narrow(0, n, t - n));
        }
        let width = t - first[0];
        let padded: Vec<Tensor> = rest
            .iter()
            .map(|r| r.constant_pad_nd([0, width - r.size()[0]]))
            .collect();
        let second = [t - first[0], t - first[1]];
        let c = model
            .forward_ragged(&mut cache, &Tensor::stack(&padded, 0), &second)
            .unwrap();
        for (row, &n) in first.iter().enumerate() {
            let r = row as i64;
            let got = Tensor::cat(&[a.get(r).narrow(0, 0, n), c.get(r).narrow(0, 0, t - n)], 0);
            let err = max_abs(&got, &full.get(r));
            assert!(err <= tol, "{name}: ragged row {row} differs by {err}");
        }
    }
}

#[test]
fn greedy_generation_equals_transformers() {
    for (name, _) in FIXTURES {
        let (_vs, model) = load(name);
        let want = expected(name);
        let prompt = want["prompt_ids"].unsqueeze(0);
        let n = want["greedy_ids"].size()[0];
        let mut cache = model.new_cache(1, prompt.size()[1] + n);
        let mut logits = model.forward_cached(&mut cache, &prompt).unwrap();
        let mut got = Vec::new();
        for _ in 0..n {
            let next = logits.select(1, -1).argmax(-1, false);
            got.push(next.int64_value(&[0]));
            logits = model
                .forward_cached(&mut cache, &next.unsqueeze(1))
                .unwrap();
        }
        let want_ids = Vec::<i64>::try_from(&want["greedy_ids"]).unwrap();
        assert_eq!(got, want_ids, "{name}: greedy continuation");
    }
}

#[test]
fn a_training_step_gives_transformers_loss_and_gradient_norm() {
    for (name, _) in FIXTURES {
        let (vs, model) = load(name);
        let want = expected(name);
        let ids = &want["train_input_ids"];
        let labels = &want["train_labels"];
        let (b, t) = ids.size2().unwrap();
        let out = model.forward(ids, true).unwrap();
        let v = out.logits_btv.size()[2];
        // transformers' causal-LM loss: labels shifted left, mean over labels != -100.
        let loss = out
            .logits_btv
            .narrow(1, 0, t - 1)
            .reshape([b * (t - 1), v])
            .cross_entropy_loss::<Tensor>(
                &labels.narrow(1, 1, t - 1).reshape([-1]),
                None,
                Reduction::Mean,
                -100,
                0.0,
            );
        let total = &loss + &out.aux_loss;
        total.backward();
        let sq: f64 = vs
            .trainable_variables()
            .iter()
            .map(|p| {
                p.grad()
                    .to_kind(Kind::Double)
                    .square()
                    .sum(Kind::Double)
                    .double_value(&[])
            })
            .sum();
        let grad_norm = sq.sqrt();
        let want_loss = want["train_loss"].double_value(&[]);
        let want_norm = want["train_grad_norm"].double_value(&[]);
        let (l, g) = (loss.double_value(&[]), grad_norm);
        println!("{name}: loss {l} vs {want_loss}, grad norm {g} vs {want_norm}");
        assert!(
            (l - want_loss).abs() <= 1e-4 * want_loss.abs(),
            "{name}: loss {l} vs {want_loss}"
        );
        assert!(
            (g - want_norm).abs() <= 1e-4 * want_norm.abs(),
            "{name}: grad norm {g} vs {want_norm}"
        );
    }
}

#[test]
fn yarn_and_group_limits_are_read_from_the_config() {
    let hf = arch::read_config(&fixture("deepseek_v3_plain_yarn")).unwrap();
    assert!(matches!(
        hf.model.rope_scaling,
        corvid_model::RopeScaling::HfYarn { factor, mscale_all_dim, .. } if factor == 4.0 && mscale_all_dim == 1.0
    ));
    let hf = arch::read_config(&fixture("deepseek_v3_qlora")).unwrap();
    assert_eq!((hf.model.n_group, hf.model.topk_group), (4, 2));
    assert!(hf.layout.rope_interleave);
}

/// A copy of fixture `name` in a temporary folder, for damaging.
fn copy_of(name: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(fixture(name)).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
    }
    dir
}

/// A config as a JSON object.
type ConfigMap = serde_json::Map<String, serde_json::Value>;

/// A change to a config, for a test case.
type ConfigEdit = Box<dyn Fn(&mut ConfigMap)>;

/// A change to a weights file's tensors, for a test case.
type WeightsEdit<'a> = &'a dyn Fn(&mut Vec<(String, Tensor)>);

fn edit_config(dir: &Path, edit: impl FnOnce(&mut ConfigMap)) {
    let path = dir.join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(cfg.as_object_mut().unwrap());
    std::fs::write(&path, serde_json::to_string_pretty(&cfg).unwrap()).unwrap();
}

fn load_error(dir: &Path) -> String {
    match arch::load(dir, Device::Cpu) {
        Ok(_) => panic!("{} loaded", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_configs_are_refused_naming_the_file_and_key() {
    let cases: Vec<(&str, ConfigEdit, &[&str])> = vec![
        (
            "unknown model_type",
            Box::new(|c| {
                c.insert("model_type".into(), "llama4".into());
            }),
            &["model_type", "llama4", "deepseek_v3"],
        ),
        (
            "missing model_type",
            Box::new(|c| {
                c.remove("model_type");
            }),
            &["model_type", "missing"],
        ),
        (
            "unknown key",
            Box::new(|c| {
                c.insert("sliding_window".into(), 4096.into());
            }),
            &["sliding_window", "4096", "does not implement"],
        ),
        (
            "unsupported value",
            Box::new(|c| {
                c.insert("hidden_act".into(), "gelu".into());
            }),
            &["hidden_act", "gelu"],
        ),
        (
            "unsupported rope type",
            Box::new(|c| {
                c["rope_parameters"]["rope_type"] = "longrope".into();
            }),
            &["rope_parameters.rope_type", "longrope"],
        ),
        (
            "wrong kind of value",
            Box::new(|c| {
                c.insert("hidden_size".into(), "big".into());
            }),
            &["hidden_size", "integer"],
        ),
        (
            "a model Corvid cannot build",
            Box::new(|c| {
                c.insert("topk_group".into(), 9.into());
            }),
            &["topk_group"],
        ),
    ];
    for (what, edit, needles) in cases {
        let dir = copy_of("deepseek_v3_plain_yarn");
        edit_config(dir.path(), edit);
        let msg = load_error(dir.path());
        assert!(msg.contains("config.json"), "{what}: {msg}");
        for n in needles {
            assert!(msg.contains(n), "{what}: `{n}` not in: {msg}");
        }
    }
    let qwen: Vec<(&str, &str, ConfigEdit, &[&str])> = vec![
        (
            "sliding-window attention",
            "qwen3",
            Box::new(|c| {
                c.insert("use_sliding_window".into(), true.into());
            }),
            &["use_sliding_window", "true"],
        ),
        (
            "a sliding layer type",
            "qwen3",
            Box::new(|c| {
                c["layer_types"][1] = "sliding_attention".into();
            }),
            &["layer_types", "sliding_attention"],
        ),
        (
            "key/value heads that do not divide the query heads",
            "qwen3",
            Box::new(|c| {
                c.insert("num_key_value_heads".into(), 3.into());
            }),
            &["num_key_value_heads", "3"],
        ),
        (
            "an attention bias",
            "qwen3_moe",
            Box::new(|c| {
                c.insert("attention_bias".into(), true.into());
            }),
            &["attention_bias", "true"],
        ),
        (
            "transformers' aux loss on",
            "qwen3_moe",
            Box::new(|c| {
                c.insert("output_router_logits".into(), true.into());
            }),
            &["output_router_logits"],
        ),
        (
            "a dense layer past the model",
            "qwen3_moe",
            Box::new(|c| {
                c.insert("mlp_only_layers".into(), serde_json::json!([1, 7]));
            }),
            &["mlp_only_layers", "7"],
        ),
        (
            "expert counts that disagree",
            "qwen3_moe",
            Box::new(|c| {
                c.insert("num_experts".into(), 4.into());
            }),
            &["num_local_experts", "num_experts is 4"],
        ),
    ];
    for (what, fixture, edit, needles) in qwen {
        let dir = copy_of(fixture);
        edit_config(dir.path(), edit);
        let msg = load_error(dir.path());
        assert!(msg.contains("config.json"), "{what}: {msg}");
        for n in needles {
            assert!(msg.contains(n), "{what}: `{n}` not in: {msg}");
        }
    }
}

#[test]
fn bad_weights_are_refused_naming_the_tensor() {
    let weights = |dir: &Path| dir.join("model.safetensors");
    let rewrite = |dir: &Path, edit: WeightsEdit| {
        let mut tensors = Tensor::read_safetensors(weights(dir)).unwrap();
        edit(&mut tensors);
        Tensor::write_safetensors(&tensors, weights(dir)).unwrap();
    };
    let dir = copy_of("deepseek_v3_qlora");
    let gone = "model.layers.1.mlp.experts.3.up_proj.weight";
    rewrite(dir.path(), &|ts| ts.retain(|(n, _)| n != gone));
    let msg = load_error(dir.path());
    assert!(msg.contains(gone) && msg.contains("missing"), "{msg}");

    let dir = copy_of("deepseek_v3_qlora");
    let cut = "model.layers.0.self_attn.kv_b_proj.weight";
    rewrite(dir.path(), &|ts| {
        for (n, t) in ts.iter_mut() {
            if n == cut {
                *t = t.narrow(0, 0, 8);
            }
        }
    });
    let msg = load_error(dir.path());
    assert!(msg.contains(cut) && msg.contains("shape"), "{msg}");

    let dir = copy_of("deepseek_v3_qlora");
    rewrite(dir.path(), &|ts| {
        ts.push((
            "model.layers.0.mlp.bias".into(),
            Tensor::zeros([4], (Kind::Float, Device::Cpu)),
        ))
    });
    let msg = load_error(dir.path());
    assert!(
        msg.contains("model.layers.0.mlp.bias") && msg.contains("not part of"),
        "{msg}"
    );

    // An MTP layer past num_hidden_layers is skipped and listed, not an error.
    let dir = copy_of("deepseek_v3_qlora");
    rewrite(dir.path(), &|ts| {
        ts.push((
            "model.layers.3.eh_proj.weight".into(),
            Tensor::zeros([4, 4], (Kind::Float, Device::Cpu)),
        ))
    });
    let (_, _, _, report) = arch::load(dir.path(), Device::Cpu).unwrap();
    assert_eq!(report.skipped.len(), 1, "{report:?}");
    assert!(report.skipped[0].0.contains("layers.3"), "{report:?}");

    // Sharded: a shard the index names but the folder lacks, and a truncated shard.
    let dir = copy_of("deepseek_v3_plain_yarn");
    std::fs::remove_file(dir.path().join("model-00002-of-00003.safetensors")).unwrap();
    let msg = load_error(dir.path());
    assert!(msg.contains("model-00002-of-00003.safetensors"), "{msg}");
    let dir = copy_of("deepseek_v3_plain_yarn");
    let shard = dir.path().join("model-00003-of-00003.safetensors");
    let bytes = std::fs::read(&shard).unwrap();
    std::fs::write(&shard, &bytes[..bytes.len() - 100]).unwrap();
    let msg = load_error(dir.path());
    assert!(msg.contains("model-00003-of-00003.safetensors"), "{msg}");
}

#[test]
fn fp8_weights_are_dequantised_by_their_block_scales() {
    let (_, _, _, report) = arch::load(&fixture("deepseek_v3_fp8"), Device::Cpu).unwrap();
    assert!(report.fp8_dequantised > 0, "{report:?}");
    // Without its scales an FP8 weight is refused by name. (The file is rewritten with the
    // safetensors crate: tch's reader has no FP8 dtype.)
    let dir = copy_of("deepseek_v3_fp8");
    let path = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let kept: Vec<_> = file
        .tensors()
        .into_iter()
        .filter(|(n, _)| n != "model.layers.0.self_attn.o_proj.weight_scale_inv")
        .collect();
    std::fs::write(&path, safetensors::serialize(kept, None).unwrap()).unwrap();
    let msg = match arch::load(dir.path(), Device::Cpu) {
        Ok(_) => panic!("loaded without scales"),
        Err(e @ ModelError::Checkpoint { .. }) => e.to_string(),
        Err(e) => panic!("unexpected error kind: {e}"),
    };
    assert!(
        msg.contains("model.layers.0.self_attn.o_proj.weight"),
        "{msg}"
    );
}

/// Every tensor of a checkpoint folder, by name (through the safetensors crate: tch's reader
/// has no FP8 dtype), as `(dtype, shape, bytes)`.
fn checkpoint_tensors(dir: &Path) -> BTreeMap<String, (String, Vec<usize>, Vec<u8>)> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if !name.ends_with(".safetensors") || name == "expected.safetensors" {
            continue;
        }
        let bytes = std::fs::read(&path).unwrap();
        let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        for (n, view) in file.tensors() {
            out.insert(
                n,
                (
                    view.dtype().to_string(),
                    view.shape().to_vec(),
                    view.data().to_vec(),
                ),
            );
        }
    }
    out
}

#[test]
fn hugging_face_to_corvid_to_hugging_face_gives_the_same_tensors() {
    for (name, dtype, shard) in [
        ("deepseek_v3_qlora", Kind::Float, 1u64 << 40),
        ("deepseek_v3_plain_yarn", Kind::Float, 60_000),
        ("deepseek_v3_bf16", Kind::BFloat16, 1 << 40),
        ("qwen3_moe", Kind::Float, 1 << 40),
        ("qwen3_moe_sparse_step", Kind::Float, 20_000),
        ("qwen3_tied_yarn", Kind::Float, 1 << 40),
    ] {
        let src = fixture(name);
        let (vs, _, hf, _) = arch::load(&src, Device::Cpu).unwrap();
        let out = tempfile::tempdir().unwrap();
        let dir = out.path().join("export");
        let report = arch::export(&vs, &hf, &src, &dir, dtype, shard).unwrap();
        let (want, got) = (checkpoint_tensors(&src), checkpoint_tensors(&dir));
        assert_eq!(
            want.keys().collect::<Vec<_>>(),
            got.keys().collect::<Vec<_>>(),
            "{name}: tensor names"
        );
        for (n, w) in &want {
            assert!(got[n] == *w, "{name}: {n} differs (dtype, shape or values)");
        }
        assert_eq!(report.shards > 1, shard < 1 << 40, "{name}: {report:?}");
        assert!(report
            .copied
            .contains(&"generation_config.json".to_string()));
        // The export is a checkpoint Corvid loads again to the same logits.
        let (_, model, _, _) = arch::load(&dir, Device::Cpu).unwrap();
        let want = expected(name);
        let err = max_abs(
            &model.forward(&want["input_ids"], false).unwrap().logits_btv,
            &want["logits"],
        );
        assert!(
            err <= 1e-4 * scale(&want["logits"]),
            "{name}: reloaded export, {err}"
        );
    }
    // An export never writes into a folder that holds something.
    let src = fixture("deepseek_v3_qlora");
    let (vs, _, hf, _) = arch::load(&src, Device::Cpu).unwrap();
    let out = tempfile::tempdir().unwrap();
    std::fs::write(out.path().join("keep.txt"), "mine").unwrap();
    let err = arch::export(&vs, &hf, &src, out.path(), Kind::Float, 1 << 30).unwrap_err();
    assert!(err.to_string().contains("not empty"), "{err}");
    assert_eq!(
        std::fs::read_to_string(out.path().join("keep.txt")).unwrap(),
        "mine"
    );
}

/// The virtualenv's Python with transformers (`scripts/bootstrap.sh`), if this checkout has it.
fn oracle_python() -> Option<PathBuf> {
    let py = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.corvid/venv/bin/python");
    py.exists().then_some(py)
}

#[test]
fn a_corvid_trained_checkpoint_exported_loads_in_transformers_with_corvids_logits() {
    let Some(python) = oracle_python() else {
        panic!("no .corvid/venv/bin/python: run `make` (scripts/bootstrap.sh) first");
    };
    for name in ["deepseek_v3_qlora", "qwen3_moe", "qwen3_tied_yarn"] {
        trained_export_loads_in_transformers(&python, name);
    }
}

/// A policy a run's context stage put under YaRN or position interpolation (`stage_rope =
/// "yarn"`, transformers' YaRN over the first stage's window, or `"linear"`) exports with its
/// scaling: transformers runs the export to Corvid's scaled logits, which differ from the
/// unscaled model's.
#[test]
fn a_policy_under_a_stage_s_yarn_exports_with_it_for_transformers() {
    let Some(python) = oracle_python() else {
        panic!("no .corvid/venv/bin/python: run `make` (scripts/bootstrap.sh) first");
    };
    let yarn = RopeScaling::hf_yarn(4.0, 8);
    let linear = RopeScaling::Linear { factor: 2.0 };
    for (name, rope) in [
        ("qwen3_moe", yarn),
        ("deepseek_v3_qlora", yarn),
        ("qwen3_moe", linear),
    ] {
        let src = fixture(name);
        let (vs, mut model, mut hf, _) = arch::load(&src, Device::Cpu).unwrap();
        assert_eq!(hf.model.rope_scaling, RopeScaling::None, "{name}");
        let probe = expected(name)["input_ids"].shallow_clone();
        let plain = model.forward(&probe, false).unwrap().logits_btv;
        let max_pos = hf.model.max_position_embeddings;
        model.extend_context(max_pos, rope).unwrap();
        hf.model.rope_scaling = rope;
        let corvid = model.forward(&probe, false).unwrap().logits_btv;
        assert!(
            max_abs(&corvid, &plain) > 1e-3,
            "{name}: YaRN changed the logits"
        );
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("staged");
        arch::export(&vs, &hf, &src, &dir, Kind::Float, 1 << 30).unwrap();
        let theirs = transformers_logits(&python, &dir, &probe);
        let err = max_abs(&theirs, &corvid);
        assert!(
            err <= 1e-4 * scale(&corvid),
            "{name}: transformers' logits differ by {err}"
        );
        // And Corvid reads the export back under the same scaling.
        assert_eq!(
            arch::read_config(&dir).unwrap().model.rope_scaling,
            rope,
            "{name}"
        );
    }
}

/// One plain gradient step on fixture `name`, exported, then read by transformers: its logits
/// must be Corvid's.
fn trained_export_loads_in_transformers(python: &Path, name: &str) {
    let src = fixture(name);
    let (vs, model, hf, _) = arch::load(&src, Device::Cpu).unwrap();
    // One plain gradient step changes every trainable weight.
    let ids = &expected(name)["train_input_ids"];
    let out = model.forward(ids, true).unwrap();
    let (b, t) = ids.size2().unwrap();
    let v = out.logits_btv.size()[2];
    let loss = out
        .logits_btv
        .narrow(1, 0, t - 1)
        .reshape([b * (t - 1), v])
        .cross_entropy_for_logits(&ids.narrow(1, 1, t - 1).reshape([-1]));
    loss.backward();
    tch::no_grad(|| {
        for mut p in vs.trainable_variables() {
            let g = p.grad();
            let _ = p.f_sub_(&(g * 0.05)).unwrap();
        }
    });
    let probe = expected(name)["input_ids"].shallow_clone();
    let corvid = model.forward(&probe, false).unwrap().logits_btv;
    assert!(
        max_abs(&corvid, &expected(name)["logits"]) > 1e-2,
        "{name}: the step changed the model"
    );
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("trained");
    arch::export(&vs, &hf, &src, &dir, Kind::Float, 1 << 30).unwrap();
    let theirs = transformers_logits(python, &dir, &probe);
    let err = max_abs(&theirs, &corvid);
    println!("{name}, trained and exported: transformers vs Corvid max |Δlogits| = {err:.3e}");
    assert!(
        err <= 1e-4 * scale(&corvid),
        "{name}: transformers' logits differ by {err}"
    );
}

/// The logits transformers computes for `ids [B, T]` with the checkpoint in `dir` (fp32,
/// eager attention), through the virtualenv's `python`.
fn transformers_logits(python: &Path, dir: &Path, ids: &Tensor) -> Tensor {
    let tmp = tempfile::tempdir().unwrap();
    let ids_path = tmp.path().join("ids.safetensors");
    Tensor::write_safetensors(&[("input_ids", ids)], &ids_path).unwrap();
    let logits_path = tmp.path().join("logits.safetensors");
    let script = format!(
        "import torch\nfrom safetensors.torch import load_file, save_file\n\
         from transformers import AutoModelForCausalLM\n\
         m = AutoModelForCausalLM.from_pretrained({dir:?}, dtype=torch.float32, attn_implementation='eager').eval()\n\
         ids = load_file({ids:?})['input_ids']\n\
         with torch.no_grad():\n    save_file({{'logits': m(ids).logits.contiguous()}}, {out:?})\n",
        dir = dir.display().to_string(),
        ids = ids_path.display().to_string(),
        out = logits_path.display().to_string(),
    );
    let status = std::process::Command::new(python)
        .args(["-c", &script])
        .env("HF_HUB_OFFLINE", "1")
        .env("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        .env("TRANSFORMERS_VERBOSITY", "error")
        .env("OMP_NUM_THREADS", "1")
        .status()
        .unwrap();
    assert!(
        status.success(),
        "transformers could not load {}",
        dir.display()
    );
    Tensor::read_safetensors(&logits_path).unwrap().remove(0).1
}

#[test]
fn a_corvid_native_model_exports_as_corvid_and_as_deepseek_v3() {
    let Some(python) = oracle_python() else {
        panic!("no .corvid/venv/bin/python: run `make` (scripts/bootstrap.sh) first");
    };
    tch::set_num_threads(1);
    tch::manual_seed(5);
    // Corvid's own model with its extras off: a DeepSeek-V3 with group limits, a leading dense
    // layer, a low-rank query and un-interleaved RoPE rows.
    let cfg = ModelConfig {
        vocab_size: 96,
        num_hidden_layers: 3,
        first_k_dense_replace: 1,
        q_lora_rank: Some(24),
        attn_gate: AttnGate::None,
        cross_layer_residual: false,
        n_group: 2,
        topk_group: 1,
        routed_scaling_factor: 2.0,
        latent_norm_eps: Some(1e-6),
        tie_word_embeddings: false,
        // Logits of order one, so that a wrong tensor shows.
        initializer_range: 0.2,
        expert_init_std: 0.2,
        ..ModelConfig::tiny()
    };
    let vs = nn::VarStore::new(Device::Cpu);
    let model = MoePolicy::new(&vs.root(), &cfg).unwrap();
    // Norms of one and a zero selection bias would hide a misplaced tensor.
    tch::no_grad(|| {
        for (name, mut t) in vs.variables() {
            if name.ends_with("norm.weight") || name.ends_with("layernorm.weight") {
                t.f_copy_(&(t.rand_like() + 0.5)).unwrap();
            }
            if name.ends_with("e_score_correction_bias") {
                t.f_copy_(&(t.randn_like() * 0.1)).unwrap();
            }
        }
    });
    let ids = Tensor::randint(cfg.vocab_size, [2, 12], (Kind::Int64, Device::Cpu));
    let corvid = model.forward(&ids, false).unwrap().logits_btv;
    let tmp = tempfile::tempdir().unwrap();
    for family in [Family::Corvid, Family::DeepseekV3] {
        let out = tmp.path().join(family.model_type());
        arch::export_native(&vs, &cfg, family, &out, Kind::Float, 1 << 30).unwrap();
        let (_, back, hf, _) = arch::load(&out, Device::Cpu).unwrap();
        assert_eq!(hf.family, family);
        let err = max_abs(&back.forward(&ids, false).unwrap().logits_btv, &corvid);
        assert!(err <= 1e-6 * scale(&corvid), "{family:?} reloaded: {err}");
    }
    // transformers runs the DeepSeek-V3 export to Corvid's logits.
    let theirs = transformers_logits(&python, &tmp.path().join("deepseek_v3"), &ids);
    let err = max_abs(&theirs, &corvid);
    println!(
        "Corvid-native model as DeepSeek-V3: transformers vs Corvid max |Δlogits| = {err:.3e}"
    );
    assert!(err <= 1e-4 * scale(&corvid), "transformers: {err}");
    // The tiny preset's gate and cross-layer residual are Corvid's own: refused as DeepSeek-V3,
    // each named; as `corvid` it exports.
    let tiny = ModelConfig::tiny();
    let vs = nn::VarStore::new(Device::Cpu);
    let _ = MoePolicy::new(&vs.root(), &tiny).unwrap();
    let out = tmp.path().join("tiny");
    let err = arch::export_native(&vs, &tiny, Family::DeepseekV3, &out, Kind::Float, 1 << 30)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("attn_gate") && err.contains("cross_layer_residual"),
        "{err}"
    );
    assert!(!out.exists(), "a refused export writes nothing");
    arch::export_native(&vs, &tiny, Family::Corvid, &out, Kind::Float, 1 << 30).unwrap();
    assert_eq!(arch::read_config(&out).unwrap().model, tiny);
}

/// Writes `config` as the `config.json` of a new folder (no weights: configs only).
fn config_folder(config: serde_json::Value) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    dir
}

#[test]
fn published_qwen3_configs_count_the_published_parameters() {
    // Qwen3-30B-A3B's config.json (the hub's keys): 30.5B parameters, 3.3B active.
    let moe = config_folder(serde_json::json!({
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
        "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 151643,
        "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
        "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144,
        "max_position_embeddings": 40960, "max_window_layers": 48, "mlp_only_layers": [],
        "moe_intermediate_size": 768, "norm_topk_prob": true, "num_attention_heads": 32,
        "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 48,
        "num_key_value_heads": 4, "output_router_logits": false, "rms_norm_eps": 1e-06,
        "rope_scaling": null, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001,
        "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
        "transformers_version": "4.51.0", "use_cache": true, "use_sliding_window": false,
        "vocab_size": 151936
    }));
    let hf = arch::read_config(moe.path()).unwrap();
    assert_eq!(hf.family, Family::Qwen3Moe);
    let p = hf.model.param_counts();
    assert!((30.4e9..30.6e9).contains(&(p.total as f64)), "{p:?}");
    assert!((3.3e9..3.4e9).contains(&(p.active as f64)), "{p:?}");
    // Qwen3-0.6B's: 0.6B parameters with tied embeddings, 0.44B without them.
    let dense = config_folder(serde_json::json!({
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
        "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 151643,
        "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 1024,
        "initializer_range": 0.02, "intermediate_size": 3072, "max_position_embeddings": 40960,
        "max_window_layers": 28, "num_attention_heads": 16, "num_hidden_layers": 28,
        "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": null,
        "rope_theta": 1000000, "sliding_window": null, "tie_word_embeddings": true,
        "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": true,
        "use_sliding_window": false, "vocab_size": 151936
    }));
    let hf = arch::read_config(dense.path()).unwrap();
    assert_eq!(hf.family, Family::Qwen3);
    let p = hf.model.param_counts();
    assert!((0.59e9..0.61e9).contains(&(p.total as f64)), "{p:?}");
    assert!(
        (0.43e9..0.45e9).contains(&((p.total - p.embedding) as f64)),
        "{p:?}"
    );
}
