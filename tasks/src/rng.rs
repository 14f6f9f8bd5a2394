//! The one random-number generator of task generation and the curriculum.
//!
//! `rand`'s `StdRng` is documented as not reproducible across `rand` versions; a task spec
//! must stay identical forever (its hash names it in stored trajectories), so generation
//! uses SplitMix64 (Steele, Lea & Flood 2014), whose whole state is one `u64` that
//! serialises trivially.

/// SplitMix64: a tiny, seedable, serialisable PRNG. Not for cryptography.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator whose sequence is fixed by `seed`.
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// A generator for one purpose of one instance: mixes a label into the seed so that,
    /// say, the file names and the filler text of an instance draw independent streams.
    pub fn derive(seed: u64, label: &str) -> Self {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325; // FNV-1a
        for b in label.bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        let mut g = Self::new(seed ^ h);
        g.next_u64();
        g
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A uniform float in `[0, 1)` (53 random bits).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A uniform integer in `0..n` (`n > 0`; returns 0 for `n == 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        // Lemire's multiply-shift; the bias is below 2^-64 · n, irrelevant here.
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// A uniform integer in `lo..=hi`, for any `lo <= hi` including the full `i64` range
    /// (`lo` when `hi < lo`). Always consumes exactly one draw.
    ///
    /// The draw for a range of fewer than 2^64 values is `lo + below(hi - lo + 1)`, and must
    /// stay so: stored trajectories are re-scored by regenerating instances from seeds.
    pub fn range(&mut self, lo: i64, hi: i64) -> i64 {
        let hi = hi.max(lo);
        // In i128 every span fits: 1 ..= 2^64.
        let span = i128::from(hi) - i128::from(lo) + 1;
        match u64::try_from(span) {
            // lo + x <= hi, so the sum is an i64.
            Ok(n) => (i128::from(lo) + i128::from(self.below(n))) as i64,
            // The full i64 range: 2^64 values, one per bit pattern of a u64.
            Err(_) => lo.wrapping_add(self.next_u64() as i64),
        }
    }

    /// A uniformly chosen element of a non-empty slice.
    pub fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len() as u64) as usize]
    }

    /// A lowercase alphanumeric string of `len` characters.
    pub fn word(&mut self, len: usize) -> String {
        const A: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
        (0..len).map(|_| *self.pick(A) as char).collect()
    }

    /// Shuffles `xs` in place (Fisher–Yates).
    pub fn shuffle<T>(&mut self, xs: &mut [T]) {
        for i in (1..xs.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            xs.swap(i, j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `lo + below(hi - lo + 1)` in wrapping arithmetic, as plain `i64`/`u64` arithmetic
    /// computes it in a release build. For the full `i64` range the span wraps to 0 and this
    /// gives `lo` on every draw (the bug `range`'s `i128` span avoids); for every range of
    /// fewer than 2^64 values it is the draw that stored seeds regenerate instances with.
    fn wrapping_span_range(g: &mut SplitMix64, lo: i64, hi: i64) -> i64 {
        let span = (hi.wrapping_sub(lo) as u64).wrapping_add(1);
        lo.wrapping_add(g.below(span) as i64)
    }

    #[test]
    fn ordinary_ranges_draw_what_the_wrapping_span_formula_draws() {
        // Draws recorded from the wrapping span formula: instances regenerated from stored
        // seeds must not change.
        let mut g = SplitMix64::derive(42, "pack/config-lookup/1");
        let got: Vec<i64> = (0..6).map(|_| g.range(1024, 65000)).collect();
        assert_eq!(got, [47732, 59301, 60955, 31579, 27480, 54612]);
        let mut g = SplitMix64::new(7);
        let got: Vec<i64> = (0..6).map(|_| g.range(-5, 5)).collect();
        assert_eq!(got, [-1, -5, 4, 1, -1, -3]);
        let mut g = SplitMix64::new(7);
        let got: Vec<i64> = (0..4).map(|_| g.range(i64::MIN, -1)).collect();
        assert_eq!(
            got,
            [
                -5627827236408588565,
                -9068527350557297906,
                -915321163446971135,
                -3846789072704039707
            ]
        );
        // And the wrapping span formula itself, draw for draw, over many ranges and seeds.
        let ranges = [
            (0, 0),
            (1, 9),
            (-5, 5),
            (1024, 65000),
            (8000, 8099),
            (i64::MIN, i64::MIN),
            (i64::MAX, i64::MAX),
            (i64::MIN, -1),
            (-1, i64::MAX),
            (i64::MIN + 1, i64::MAX),
            (i64::MIN, i64::MAX - 1),
        ];
        for (lo, hi) in ranges {
            for seed in 0..200 {
                let (mut a, mut b) = (SplitMix64::new(seed), SplitMix64::new(seed));
                for _ in 0..8 {
                    let want = wrapping_span_range(&mut b, lo, hi);
                    let got = a.range(lo, hi);
                    assert_eq!(got, want, "range({lo}, {hi}), seed {seed}");
                    assert!((lo..=hi).contains(&got), "range({lo}, {hi}) gave {got}");
                }
                assert_eq!(
                    a, b,
                    "range({lo}, {hi}) consumed a different number of draws"
                );
            }
        }
    }

    #[test]
    fn full_i64_range_draws_across_the_range() {
        let draws: Vec<i64> = (0..256)
            .map(|seed| SplitMix64::new(seed).range(i64::MIN, i64::MAX))
            .collect();
        assert!(draws.iter().any(|&x| x != i64::MIN), "always the minimum");
        // Uniform over all of i64: both signs turn up, and no value twice in 256 draws.
        assert!(draws.iter().any(|&x| x < 0) && draws.iter().any(|&x| x > 0));
        let distinct: std::collections::BTreeSet<i64> = draws.iter().copied().collect();
        assert_eq!(distinct.len(), draws.len());
        // Still one draw per value, like every other range.
        let (mut a, mut b) = (SplitMix64::new(3), SplitMix64::new(3));
        a.range(i64::MIN, i64::MAX);
        b.next_u64();
        assert_eq!(a, b);
    }

    #[test]
    fn reversed_range_gives_its_low_end() {
        let mut g = SplitMix64::new(1);
        assert_eq!(g.range(5, 4), 5);
        assert_eq!(g.range(i64::MAX, i64::MIN), i64::MAX);
    }
}
