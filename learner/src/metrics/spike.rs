//! The loss-spike rule: a policy loss above `mean + k·std` of the previous `window` losses is
//! a spike, once `min_samples` are in the window. The detector is checkpointed with the run,
//! its window as exact `f64` bits, so a resumed run judges the next loss as an unbroken one
//! would.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use super::SpikeFigures;

/// `f64`s as their IEEE bits: serde_json's default float parsing may miss the last bit,
/// and a resumed run must judge the next loss against exactly the same window.
mod f64_bits {
    use std::collections::VecDeque;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(xs: &VecDeque<f64>, s: S) -> Result<S::Ok, S::Error> {
        xs.iter()
            .map(|x| x.to_bits())
            .collect::<Vec<u64>>()
            .serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<VecDeque<f64>, D::Error> {
        Ok(Vec::<u64>::deserialize(d)?
            .into_iter()
            .map(f64::from_bits)
            .collect())
    }
}

/// The loss-spike rule: a value above `mean + k·std` of the previous `window` values.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpikeDetector {
    k: f64,
    window: usize,
    min_samples: usize,
    #[serde(with = "f64_bits")]
    recent: VecDeque<f64>,
    count: u64,
}

impl SpikeDetector {
    /// A detector with threshold `k` standard deviations over `window` values, active after
    /// `min_samples`.
    pub fn new(k: f64, window: usize, min_samples: usize) -> Self {
        Self {
            k,
            window: window.max(2),
            min_samples: min_samples.max(2),
            recent: VecDeque::new(),
            count: 0,
        }
    }

    /// Judges `loss` against the window (before adding it), then adds it. Non-finite losses
    /// are always spikes and are not added to the window.
    pub fn observe(&mut self, loss: f64) -> SpikeFigures {
        let n = self.recent.len() as f64;
        let mean = self.recent.iter().sum::<f64>() / n.max(1.0);
        let var = self.recent.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n.max(1.0);
        let std = var.sqrt();
        let spike = !loss.is_finite()
            || (self.recent.len() >= self.min_samples && loss > mean + self.k * std);
        if spike {
            self.count += 1;
        }
        if loss.is_finite() {
            self.recent.push_back(loss);
            while self.recent.len() > self.window {
                self.recent.pop_front();
            }
        }
        SpikeFigures {
            spike,
            count: self.count,
            window_mean: mean,
            window_std: std,
        }
    }

    /// Spikes so far.
    pub fn count(&self) -> u64 {
        self.count
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spike_is_a_loss_above_mean_plus_k_std_of_the_window() {
        let mut d = SpikeDetector::new(3.0, 10, 4);
        for x in [1.0, 1.1, 0.9, 1.0] {
            assert!(!d.observe(x).spike);
        }
        // Window mean 1.0, std ≈ 0.0707: the threshold is ≈ 1.212, so 1.2 is not a spike.
        assert!(!d.observe(1.2).spike);
        let f = d.observe(5.0);
        assert!(f.spike);
        assert_eq!(f.count, 1);
        assert!(d.observe(f64::NAN).spike);
        assert_eq!(d.count(), 2);
    }

    #[test]
    fn the_window_survives_json_bit_for_bit() {
        let mut d = SpikeDetector::new(3.0, 10, 4);
        for i in 0..7 {
            d.observe(-0.123_456_789_012_345_67 * f64::from(i) + 1e-17);
        }
        let back: SpikeDetector =
            serde_json::from_str(&serde_json::to_string(&d).unwrap()).unwrap();
        assert_eq!(back, d);
    }

    #[test]
    fn no_spike_is_counted_before_min_samples() {
        let mut d = SpikeDetector::new(1.0, 10, 5);
        for x in [0.0, 0.0, 0.0, 100.0] {
            assert!(!d.observe(x).spike);
        }
    }
}
