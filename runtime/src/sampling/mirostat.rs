//! Mirostat v1 and v2 (llama.cpp's `mirostat` and `mirostat-v2` samplers): each keeps a running
//! target surprise `mu` (starting at `2 · tau`), cuts the candidates by it, draws a token, and
//! moves `mu` by `eta` times the gap between the drawn token's surprise (`-log2 p`) and `tau`.
//! Either one replaces the chain after the temperature.

use super::candidates::Candidates;
use super::rng::Mt19937;

/// Tokens v1 fits the Zipf exponent over (llama-server's fixed `m`).
pub const ZIPF_TOKENS: usize = 100;

/// Which Mirostat.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    /// The first: a top-k whose k comes from a Zipf fit of the top tokens.
    V1,
    /// Mirostat 2.0: drops the tokens whose surprise exceeds `mu`.
    V2,
}

/// A Mirostat sampler's state.
#[derive(Clone, Debug)]
pub struct Mirostat {
    version: Version,
    tau: f32,
    eta: f32,
    mu: f32,
    n_vocab: usize,
    rng: Mt19937,
}

/// `x as i32` as x86's truncating conversion does it: a value out of range (or NaN) gives
/// `i32::MIN`, which llama.cpp's `int(k)` yields there.
fn x86_int(x: f32) -> i32 {
    if !(-2_147_483_648.0..2_147_483_648.0).contains(&x) {
        i32::MIN
    } else {
        x as i32
    }
}

impl Mirostat {
    /// A sampler aiming at surprise `tau` with learning rate `eta` over `n_vocab` tokens.
    pub fn new(version: Version, tau: f32, eta: f32, n_vocab: usize, seed: u32) -> Self {
        Mirostat {
            version,
            tau,
            eta,
            mu: 2.0 * tau,
            n_vocab,
            rng: Mt19937::new(seed),
        }
    }

    /// The running target surprise.
    pub fn mu(&self) -> f32 {
        self.mu
    }

    /// Cuts the candidates (sorted, with probabilities over those left), draws one and moves
    /// `mu`; returns the drawn index. `None` for no candidates. Does not allocate.
    pub fn sample(&mut self, cands: &mut Candidates) -> Option<usize> {
        if cands.is_empty() {
            return None;
        }
        cands.sort();
        cands.softmax();
        let keep = match self.version {
            Version::V1 => self.zipf_k(cands),
            Version::V2 => {
                let over = cands.data.iter().position(|t| -t.p.log2() > self.mu);
                over.unwrap_or(cands.len()).max(1)
            }
        };
        cands.data.truncate(keep);
        cands.softmax();
        let i = self.rng.discrete(cands.data.iter().map(|t| t.p));
        let surprise = -cands.data[i].p.log2();
        self.mu -= self.eta * (surprise - self.tau);
        Some(i)
    }

    /// v1's k: the Zipf exponent fitted over the top tokens' probability ratios, then the k
    /// whose expected surprise is `mu`; at least one.
    fn zipf_k(&self, cands: &Candidates) -> usize {
        let (mut sum_tb, mut sum_tt) = (0f32, 0f32);
        let fit = (ZIPF_TOKENS - 1).min(cands.len() - 1);
        for i in 0..fit {
            let t = ((i + 2) as f32 / (i + 1) as f32).ln();
            let b = (cands.data[i].p / cands.data[i + 1].p).ln();
            sum_tb += t * b;
            sum_tt += t * t;
        }
        let s_hat = sum_tb / sum_tt;
        let eps = s_hat - 1.0;
        let k = ((eps * 2f32.powf(self.mu)) / (1.0 - (self.n_vocab as f32).powf(-eps)))
            .powf(1.0 / s_hat);
        let k = x86_int(k).max(1) as usize;
        k.min(cands.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v2_keeps_tokens_below_mu_and_moves_mu_toward_tau() {
        // p = 0.5, 0.25, 0.125, 0.125: surprises 1, 2, 3, 3 bits; mu starts at 2·tau = 4 bits.
        let mut m = Mirostat::new(Version::V2, 2.0, 0.5, 4, 0);
        let mut c = Candidates::default();
        c.fill(&[0.5f32, 0.25, 0.125, 0.125].map(f32::ln));
        let i = m.sample(&mut c).unwrap();
        assert_eq!(c.len(), 4);
        let s = -c.data[i].p.log2();
        assert!((m.mu() - (4.0 - 0.5 * (s - 2.0))).abs() < 1e-6);
        // mu = 1.5 bits keeps only the top token.
        let mut m = Mirostat::new(Version::V2, 0.75, 0.0, 4, 0);
        c.fill(&[0.5f32, 0.25, 0.125, 0.125].map(f32::ln));
        assert_eq!(m.sample(&mut c), Some(0));
        assert_eq!(c.len(), 1);
    }

    #[test]
    fn v1_keeps_at_least_one_token() {
        let mut m = Mirostat::new(Version::V1, 0.01, 0.1, 4, 0);
        let mut c = Candidates::default();
        c.fill(&[3.0, 1.0, 0.5, 0.0]);
        assert_eq!(m.sample(&mut c), Some(0));
        assert!(!c.is_empty());
    }
}
