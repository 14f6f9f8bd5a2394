//! Whether a model fits the memory of its device, decided before any tensor exists:
//! [`ModelConfig::build_bytes`] sizes the weights, router biases and RoPE tables from the config
//! alone, and [`ModelConfig::check_fits`] compares them with the CPU's `MemTotal`
//! (`/proc/meminfo`) or the CUDA device's total memory and refuses, naming the field that drives
//! the size. [`MoePolicy::new`](super::MoePolicy::new) runs it, so an oversized config is an
//! error instead of libtorch's allocation panic.

use tch::{Device, Kind};

use super::accounting::largest_part;
use super::config::ModelConfig;
use super::ModelError;

/// Bytes per parameter as [`MoePolicy::new`](super::MoePolicy::new) creates them: fp32 (the
/// bf16 cast of [`MoePolicy::new_in_kind`](super::MoePolicy::new_in_kind) comes after).
pub const BUILD_BYTES_PER_PARAM: u64 = 4;

/// What building a model takes, from [`ModelConfig::build_bytes`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BuildBytes {
    /// Parameters ([`ParamCounts::total`](super::ParamCounts::total)).
    pub params: i64,
    /// Bytes per parameter while building.
    pub bytes_per_param: u64,
    /// `params x bytes_per_param`.
    pub weights: u128,
    /// The fp32 router selection biases (not parameters: no gradient).
    pub router_biases: u128,
    /// The f64 RoPE cos/sin tables kept on the model's device.
    pub rope_device: u128,
    /// The f64 RoPE tables computed on the CPU while building (positions, angles, cos, sin).
    pub rope_host: u128,
}

impl ModelConfig {
    /// What building this model takes, in bytes, before any tensor exists: the parameters at
    /// `max(4, size of kind)` bytes each (fp32 as built, or the wider dtype they are cast to),
    /// the fp32 router biases, and the f64 RoPE tables (computed on the CPU, then kept on the
    /// model's device). Validates first.
    pub fn build_bytes(&self, kind: Kind) -> Result<BuildBytes, ModelError> {
        // `validate`, counting the parameters once.
        let p = self.try_param_counts()?;
        self.check_rope_size()?;
        let per_param = BUILD_BYTES_PER_PARAM.max(kind.elt_size_in_bytes() as u64);
        // Validated: every value below is non-negative and their products fit MAX_ELEMENTS.
        let moe_layers = self.n_moe_layers() as u128;
        let positions = self.max_position_embeddings as u128;
        let half = (self.rope_dim() / 2) as u128;
        Ok(BuildBytes {
            params: p.total,
            bytes_per_param: per_param,
            weights: p.total as u128 * u128::from(per_param),
            router_biases: moe_layers * self.n_routed_experts as u128 * 4,
            rope_device: 2 * positions * half * 8,
            rope_host: positions * (1 + 3 * half) * 8,
        })
    }

    /// Refuses, before anything is allocated, a config whose weights cannot fit the memory of
    /// `device` (built in `kind`, see [`ModelConfig::build_bytes`]), and a CUDA device libtorch
    /// does not see. The memory is the CPU's `MemTotal` (`/proc/meminfo`) or the CUDA device's
    /// total memory (from the driver); where it cannot be read, only the size rules of
    /// [`ModelConfig::validate`] apply. [`MoePolicy::new`](super::MoePolicy::new) runs this.
    pub fn check_fits(&self, device: Device, kind: Kind) -> Result<(), ModelError> {
        let need = self.build_bytes(kind)?;
        let host = host_memory_bytes().map(|b| (b, "MemTotal in /proc/meminfo"));
        match device {
            Device::Cpu => self.check_memory(
                &need,
                need.weights + need.router_biases,
                need.rope_host,
                "cpu",
                host,
            ),
            Device::Cuda(i) => {
                let count = tch::Cuda::device_count();
                if i as i64 >= count {
                    return Err(ModelError::Device(format!(
                        "the model is to be built on cuda:{i}, but libtorch sees {count} CUDA \
                         device(s)"
                    )));
                }
                let total = super::cuda::runtime::device_total_memory(i);
                self.check_memory(
                    &need,
                    need.weights + need.router_biases,
                    need.rope_device,
                    &format!("cuda:{i}"),
                    total.map(|b| (b, "total memory from the CUDA driver")),
                )?;
                // The RoPE tables are computed on the host before they move to the device.
                self.check_memory(&need, 0, need.rope_host, "cpu", host)
            }
            _ => Ok(()),
        }
    }

    /// Refuses `weights + tables` bytes on `device`, whose memory is `limit` (bytes, and where
    /// that figure comes from; `None`: unknown, nothing refused). The error names the field
    /// that drives the larger of the two.
    fn check_memory(
        &self,
        need: &BuildBytes,
        weights: u128,
        tables: u128,
        device: &str,
        limit: Option<(u64, &str)>,
    ) -> Result<(), ModelError> {
        let Some((limit, source)) = limit else {
            return Ok(());
        };
        let bytes = weights + tables;
        if bytes <= u128::from(limit) {
            return Ok(());
        }
        let (field, value, largest) = if tables > weights {
            let what = format!(
                "the f64 RoPE tables (max_position_embeddings x qk_rope_head_dim / 2 entries, {})",
                fmt_bytes(tables)
            );
            (
                "max_position_embeddings",
                self.max_position_embeddings,
                what,
            )
        } else {
            let parts = self.param_parts();
            let p = largest_part(&parts);
            let x = p.largest();
            let what = format!("{} ({} = {:.3e} parameters)", p.what, p.expr(), p.approx());
            (x.field, x.value, what)
        };
        let breakdown = if weights > 0 {
            format!(
                "{} parameters x {} bytes = {}, plus {} of RoPE tables and router biases",
                need.params,
                need.bytes_per_param,
                fmt_bytes(need.weights),
                fmt_bytes(bytes - need.weights)
            )
        } else {
            "the RoPE tables, computed in f64 on the host".to_string()
        };
        Err(ModelError::TooLarge {
            device: device.to_string(),
            field,
            detail: format!(
                "{field} = {value}: building the model takes {} on {device} ({breakdown}), \
                 more than the {} of memory it has ({source}); the largest part is {largest}",
                fmt_bytes(bytes),
                fmt_bytes(u128::from(limit)),
            ),
        })
    }
}

/// `MemTotal` of `/proc/meminfo` in bytes, where there is one.
pub fn host_memory_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_mem_total(&text)
}

/// The `MemTotal:  N kB` line of a `/proc/meminfo` text, in bytes.
fn parse_mem_total(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let mut words = line["MemTotal:".len()..].split_whitespace();
    let n: u64 = words.next()?.parse().ok()?;
    let unit = match words.next() {
        None => 1,
        Some(u) if u.eq_ignore_ascii_case("kb") => 1024,
        Some(_) => return None,
    };
    n.checked_mul(unit)
}

/// `1.5 GiB`.
fn fmt_bytes(bytes: u128) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut x = bytes as f64;
    let mut unit = 0;
    while x >= 1024.0 && unit + 1 < UNITS.len() {
        x /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{x:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::Strategy as _;

    use super::super::accounting::MAX_ELEMENTS;
    use super::*;

    #[test]
    fn weights_past_the_device_memory_are_refused_before_allocating() {
        // Valid for libtorch (below MAX_ELEMENTS) but 512 TiB of fp32 weights.
        let cfg = ModelConfig {
            vocab_size: 1 << 40,
            ..ModelConfig::tiny()
        };
        cfg.validate().unwrap();
        let need = cfg.build_bytes(Kind::Float).unwrap();
        assert_eq!(need.weights, cfg.param_counts().total as u128 * 4);
        let limit = Some((64 << 30, "a test limit"));
        let err = cfg
            .check_memory(&need, need.weights, need.rope_host, "cpu", limit)
            .unwrap_err();
        assert!(matches!(
            err,
            ModelError::TooLarge {
                field: "vocab_size",
                ..
            }
        ));
        let msg = err.to_string();
        for part in [
            "vocab_size = 1099511627776",
            "512.0 TiB",
            "64.0 GiB",
            "a test limit",
            "the token embedding",
        ] {
            assert!(msg.contains(part), "{part:?} missing from {msg}");
        }
        // Where the memory is known (Linux), the real check refuses it too, and so does
        // every model constructor, with an error instead of libtorch's allocation panic.
        if host_memory_bytes().is_some() {
            let msg = cfg
                .check_fits(Device::Cpu, Kind::Float)
                .unwrap_err()
                .to_string();
            assert!(
                msg.contains("vocab_size") && msg.contains("MemTotal"),
                "{msg}"
            );
            let vs = tch::nn::VarStore::new(Device::Cpu);
            let err = crate::MoePolicy::new(&vs.root(), &cfg).unwrap_err();
            assert!(err.to_string().contains("vocab_size"), "{err}");
            assert!(vs.variables().is_empty(), "nothing was allocated");
            let err = crate::MoePolicy::new_in_kind(&vs, &cfg, Kind::BFloat16).unwrap_err();
            assert!(err.to_string().contains("vocab_size"), "{err}");
            // Huge RoPE tables are named by their field.
            let cfg = ModelConfig {
                max_position_embeddings: 1 << 40,
                ..ModelConfig::tiny()
            };
            let err = crate::MoePolicy::new(&vs.root(), &cfg).unwrap_err();
            assert!(
                matches!(
                    err,
                    ModelError::TooLarge {
                        field: "max_position_embeddings",
                        ..
                    }
                ),
                "{err}"
            );
        }
        // The k3 shape is for accounting only: counted, never built on this machine.
        let k3 = ModelConfig::k3_shape();
        assert!(k3.param_counts().total > 1_000_000_000_000);
        let err = k3
            .check_memory(
                &k3.build_bytes(Kind::Float).unwrap(),
                k3.build_bytes(Kind::Float).unwrap().weights,
                0,
                "cpu",
                limit,
            )
            .unwrap_err();
        let msg = err.to_string();
        assert!(
            matches!(err, ModelError::TooLarge { .. }) && msg.contains("the routed experts"),
            "{msg}"
        );
    }

    #[test]
    fn presets_fit_and_absent_devices_are_refused() {
        for cfg in [ModelConfig::tiny(), ModelConfig::small()] {
            cfg.check_fits(Device::Cpu, Kind::Float).unwrap();
        }
        let need = ModelConfig::gpu_1b().build_bytes(Kind::BFloat16).unwrap();
        assert_eq!(need.bytes_per_param, 4, "built in fp32, then cast");
        assert!(need.weights < 5 << 30, "{need:?}");
        assert_eq!(
            ModelConfig::tiny()
                .build_bytes(Kind::Double)
                .unwrap()
                .bytes_per_param,
            8
        );
        let err = ModelConfig::tiny()
            .check_fits(Device::Cuda(4096), Kind::BFloat16)
            .unwrap_err();
        assert!(matches!(err, ModelError::Device(_)), "{err}");
        assert!(err.to_string().contains("cuda:4096"), "{err}");
    }

    #[test]
    fn mem_total_parses() {
        let text = "MemTotal:       24683584 kB\nMemFree:  1 kB\n";
        assert_eq!(parse_mem_total(text), Some(24683584 * 1024));
        assert_eq!(parse_mem_total("MemFree: 1 kB\n"), None);
        assert_eq!(parse_mem_total("MemTotal: lots\n"), None);
        assert_eq!(fmt_bytes(512), "512 B");
        assert_eq!(fmt_bytes(3 << 29), "1.5 GiB");
    }

    proptest::proptest! {
        /// Whatever the sizes, validating, counting and sizing return; nothing overflows.
        #[test]
        fn any_sizes_give_an_answer_not_a_panic(
            vals in proptest::collection::vec(
                proptest::prop_oneof![
                    proptest::num::i64::ANY,
                    (0i64..64).prop_map(|s| 1i64 << s),
                    -2i64..300,
                ],
                13,
            ),
            q_lora in proptest::option::of(proptest::num::i64::ANY),
            ctx in proptest::num::i64::ANY,
        ) {
            let cfg = ModelConfig {
                vocab_size: vals[0],
                hidden_size: vals[1],
                num_hidden_layers: vals[2],
                num_attention_heads: vals[3],
                kv_lora_rank: vals[4],
                qk_nope_head_dim: vals[5],
                qk_rope_head_dim: vals[6],
                v_head_dim: vals[7],
                cla_factor: vals[8],
                max_position_embeddings: vals[9],
                n_routed_experts: vals[10],
                moe_intermediate_size: vals[11],
                n_shared_experts: vals[12],
                q_lora_rank: q_lora,
                ..ModelConfig::small()
            };
            let ok = cfg.validate().is_ok();
            let counts = cfg.try_param_counts();
            proptest::prop_assert!(!ok || counts.is_ok());
            if let Ok(p) = counts {
                proptest::prop_assert!(p.total <= MAX_ELEMENTS && p.active <= p.total);
                proptest::prop_assert!(p.embedding <= p.total);
            }
            let _ = (cfg.param_counts(), cfg.flops_per_token(ctx));
            let _ = (cfg.cache_elems_per_token(), cfg.kv_ratio_vs_mha());
            let _ = cfg.build_bytes(Kind::Float);
            let limit = Some((1u64 << 30, "test"));
            if let Ok(need) = cfg.build_bytes(Kind::Float) {
                let _ = cfg.check_memory(&need, need.weights, need.rope_host, "cpu", limit);
            }
        }
    }
}
