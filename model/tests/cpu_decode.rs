//! The fused CPU decode core (`model::mla_cpu`) computes the ATen reference's attention on
//! every shape it may meet (head counts that are and are not multiples of four, widths the
//! SIMD kernel takes and widths only the portable code takes, no RoPE part, empty, partial and
//! full rows, a narrowed cache, one and several threads), and a model on the CPU decodes
//! through it with the matmul path's logits.

use corvid_model::cuda::MlaDecode;
use corvid_model::mla_cpu;
use corvid_model::{DecodeCore, ModelConfig, MoePolicy};
use tch::{nn, Device, Kind, Tensor};

mod common;
use common::{max_abs, DecodeInputs};

#[test]
fn the_cpu_core_equals_the_aten_reference_on_every_shape() {
    tch::manual_seed(3);
    // (heads, slots, capacity, latent c, rope r): the demo's widths (SIMD kernel, one group
    // of four heads), three and six heads (groups of 1-3), widths only the portable code
    // takes (c % 16 != 0, r % 8 != 0), and no RoPE part.
    let shapes = [
        (4, 37, 50, 128, 32),
        (3, 20, 20, 32, 8),
        (6, 33, 40, 48, 16),
        (2, 9, 12, 24, 8),
        (5, 17, 17, 32, 4),
        (2, 11, 16, 32, 0),
    ];
    for threads in [1, 2] {
        tch::set_num_threads(threads);
        for &(h, s, cap, c, r) in &shapes {
            // Rows: empty, one slot, partial, full, and a length past the slots (clamped).
            let lens = [0, 1, s / 2, s, s + 5];
            let p = DecodeInputs::new(h, s, cap, c, r, &lens, Kind::Float);
            let scale = 1.0 / ((c + r) as f64).sqrt();
            let want = p.problem(scale).reference(None).unwrap();
            let got = mla_cpu::decode(&p.problem(scale)).unwrap();
            assert_eq!(got.size(), [lens.len() as i64, h, c]);
            let d = max_abs(&got, &want);
            assert!(
                d < 2e-5,
                "threads {threads} h {h} s {s} c {c} r {r}: max |cpu - reference| = {d}"
            );
            // The empty row is exactly zero.
            assert_eq!(got.get(0).abs().max().double_value(&[]), 0.0);
        }
    }
    tch::set_num_threads(1);
}

#[test]
fn the_cpu_core_refuses_what_it_cannot_compute_by_name() {
    let p = DecodeInputs::new(2, 5, 5, 16, 8, &[5, 3], Kind::Float);
    let f64_q = p.q_lat.to_kind(Kind::Double);
    let wrong = MlaDecode {
        q_lat_bhc: &f64_q,
        ..p.problem(1.0)
    };
    assert!(!mla_cpu::supports(&wrong));
    let err = mla_cpu::decode(&wrong).unwrap_err().to_string();
    assert!(err.contains("q_pe is Float but q_lat is Double"), "{err}");
    let f64_all = DecodeInputs {
        q_lat: p.q_lat.to_kind(Kind::Double),
        q_pe: p.q_pe.to_kind(Kind::Double),
        c_kv: p.c_kv.to_kind(Kind::Double),
        k_pe: p.k_pe.to_kind(Kind::Double),
        lens: p.lens.shallow_clone(),
    };
    let err = mla_cpu::decode(&f64_all.problem(1.0))
        .unwrap_err()
        .to_string();
    assert!(err.contains("float32 on the CPU"), "{err}");
    let short_lens = Tensor::from_slice(&[1i64]);
    let err = mla_cpu::decode(&MlaDecode {
        lens_b: &short_lens,
        ..p.problem(1.0)
    })
    .unwrap_err()
    .to_string();
    assert!(err.contains("lens must be [B] = [2]"), "{err}");
}

/// A model on the CPU decodes through the CPU core by default, and its logits are the
/// matmul path's, for full and ragged steps, with and without the latent token shift.
#[test]
fn a_cpu_model_decodes_through_the_cpu_core_with_the_matmul_paths_logits() {
    for shift in [false, true] {
        tch::manual_seed(17);
        let cfg = ModelConfig {
            num_hidden_layers: 2,
            latent_token_shift: shift,
            max_position_embeddings: 256,
            ..ModelConfig::tiny()
        };
        let vs = nn::VarStore::new(Device::Cpu);
        let mut model = MoePolicy::new(&vs.root(), &cfg).unwrap();
        assert_eq!(model.decode_core(), Some(DecodeCore::Cpu));
        let prompt = Tensor::randint(cfg.vocab_size, [3, 40], (Kind::Int64, Device::Cpu));
        let mut cache = model.new_cache(3, 64);
        let _ = model
            .forward_ragged(&mut cache, &prompt, &[40, 7, 23])
            .unwrap();
        let mut a = cache.select(&[0, 1, 2]).unwrap();
        let mut b = cache.select(&[0, 1, 2]).unwrap();
        for (i, new_b) in [[1, 1, 1], [1, 0, 1], [0, 1, 1], [1, 1, 1]]
            .iter()
            .enumerate()
        {
            let step = Tensor::randint(cfg.vocab_size, [3, 1], (Kind::Int64, Device::Cpu));
            model.set_decode_core(None);
            let want = model.forward_ragged(&mut a, &step, new_b).unwrap();
            model.set_decode_core(Some(DecodeCore::Cpu));
            let got = model.forward_ragged(&mut b, &step, new_b).unwrap();
            assert_eq!(a.lens(), b.lens());
            for (row, _) in new_b.iter().enumerate().filter(|(_, &n)| n == 1) {
                let d = max_abs(&got.get(row as i64), &want.get(row as i64));
                assert!(d < 1e-4, "shift {shift} step {i} row {row}: {d}");
            }
        }
    }
}
