//! The random numbers of llama.cpp's samplers: the 32-bit Mersenne Twister (MT19937, the
//! generator C++ calls `std::mt19937`) seeded with the request's 32-bit seed, and the three ways
//! llama.cpp turns its output into a choice, with the arithmetic of GNU libstdc++ (the C++
//! library llama.cpp is built against on Linux): a uniform `f64` in `[0, 1)` from two outputs
//! (`dist`), a uniform `f32` from one (`xtc`), and a discrete choice over probabilities
//! (`mirostat`, `mirostat v2`, `adaptive-p`). The same seed therefore draws the same tokens as
//! llama.cpp from the same candidates.

const N: usize = 624;
const M: usize = 397;
const MATRIX_A: u32 = 0x9908_b0df;
const UPPER: u32 = 0x8000_0000;
const LOWER: u32 = 0x7fff_ffff;
/// 2^32: the number of values one output takes.
const RANGE: f64 = 4_294_967_296.0;

/// A 32-bit Mersenne Twister. Does not allocate after construction.
#[derive(Clone)]
pub struct Mt19937 {
    state: Box<[u32; N]>,
    index: usize,
}

impl std::fmt::Debug for Mt19937 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mt19937")
            .field("index", &self.index)
            .finish()
    }
}

impl Mt19937 {
    /// The generator seeded as `std::mt19937(seed)` is.
    pub fn new(seed: u32) -> Self {
        let mut state = Box::new([0u32; N]);
        state[0] = seed;
        for i in 1..N {
            let prev = state[i - 1];
            state[i] = 1_812_433_253u32
                .wrapping_mul(prev ^ (prev >> 30))
                .wrapping_add(i as u32);
        }
        Mt19937 { state, index: N }
    }

    fn twist(&mut self) {
        let s = &mut self.state;
        for i in 0..N {
            let y = (s[i] & UPPER) | (s[(i + 1) % N] & LOWER);
            let mut next = s[(i + M) % N] ^ (y >> 1);
            if y & 1 != 0 {
                next ^= MATRIX_A;
            }
            s[i] = next;
        }
        self.index = 0;
    }

    /// The next 32-bit output.
    pub fn next_u32(&mut self) -> u32 {
        if self.index >= N {
            self.twist();
        }
        let mut y = self.state[self.index];
        self.index += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }

    /// A uniform number in `[0, 1)` from two outputs, low word first (libstdc++'s
    /// `generate_canonical<double, 53>`, which `uniform_real_distribution<double>(0, 1)` and
    /// `discrete_distribution` use).
    pub fn uniform_f64(&mut self) -> f64 {
        let mut sum = f64::from(self.next_u32());
        sum += f64::from(self.next_u32()) * RANGE;
        let u = sum / (RANGE * RANGE);
        if u >= 1.0 {
            1.0f64.next_down_compat()
        } else {
            u
        }
    }

    /// A uniform number in `[0, 1)` from one output, in `f32` (libstdc++'s
    /// `generate_canonical<float, 24>`).
    pub fn uniform_f32(&mut self) -> f32 {
        let u = self.next_u32() as f32 / RANGE as f32;
        if u >= 1.0 {
            1.0f32.next_down_compat()
        } else {
            u
        }
    }

    /// An index drawn with probability proportional to `weights` (libstdc++'s
    /// `discrete_distribution`: the weights normalized and summed in `f64`, the last running
    /// sum set to one, and the first index whose running sum reaches a uniform draw). Fewer
    /// than two weights give 0 without a draw, as libstdc++ keeps no table for them. Does not
    /// allocate.
    pub fn discrete(&mut self, weights: impl Iterator<Item = f32> + Clone) -> usize {
        let n = weights.clone().count();
        if n < 2 {
            return 0;
        }
        let total: f64 = weights.clone().map(f64::from).sum();
        let u = self.uniform_f64();
        let mut running = 0f64;
        for (i, w) in weights.enumerate() {
            running += f64::from(w) / total;
            if i + 1 == n || running >= u {
                return i;
            }
        }
        n - 1
    }
}

/// `next_down` for the two float types (stable Rust has it only from 1.86 on).
trait NextDown {
    fn next_down_compat(self) -> Self;
}

impl NextDown for f64 {
    fn next_down_compat(self) -> f64 {
        f64::from_bits(self.to_bits() - 1)
    }
}

impl NextDown for f32 {
    fn next_down_compat(self) -> f32 {
        f32::from_bits(self.to_bits() - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ten_thousandth_output_is_the_standard_one() {
        // C++11 requires std::mt19937 default-seeded (5489) to give 4123659995 as its
        // 10000th output.
        let mut g = Mt19937::new(5489);
        let mut last = 0;
        for _ in 0..10_000 {
            last = g.next_u32();
        }
        assert_eq!(last, 4_123_659_995);
    }

    #[test]
    fn uniform_draws_lie_in_the_unit_interval() {
        let mut g = Mt19937::new(1);
        for _ in 0..1000 {
            let (a, b) = (g.uniform_f64(), g.uniform_f32());
            assert!((0.0..1.0).contains(&a) && (0.0..1.0).contains(&b));
        }
    }

    #[test]
    fn discrete_follows_the_weights() {
        let mut g = Mt19937::new(3);
        let w = [1.0f32, 0.0, 3.0];
        let mut counts = [0u32; 3];
        for _ in 0..40_000 {
            counts[g.discrete(w.iter().copied())] += 1;
        }
        assert_eq!(counts[1], 0);
        let ratio = f64::from(counts[2]) / f64::from(counts[0]);
        assert!((ratio - 3.0).abs() < 0.15, "{counts:?}");
    }
}
