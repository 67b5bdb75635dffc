//! Random sentences of a grammar, for tests and the grammar oracle: each rule picks an
//! alternative at random until the derivation is deep, then the shortest way out.

use crate::gbnf::{CharClass, Grammar, Item};

/// Characters drawn for `.` and negated classes (ASCII, accents, CJK, an emoji).
const POOL: &[char] = &[
    'a', 'Z', '0', '7', ' ', '-', '_', ',', ':', '"', '\\', '{', '}', '[', ']', '\n', 'é', '中',
    '😀',
];

/// A small deterministic generator (xorshift).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n.max(1) as u64) as usize
    }
}

impl Grammar {
    /// A random sentence (None when the grammar has token items, or no finite sentence).
    pub fn sample(&self, seed: u64) -> Option<String> {
        let cost = self.shortest();
        if cost[self.root as usize] == usize::MAX {
            return None;
        }
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let mut out = String::new();
        self.expand(self.root, 0, &cost, &mut rng, &mut out)?;
        Some(out)
    }

    /// The fewest characters each rule can produce.
    fn shortest(&self) -> Vec<usize> {
        let mut cost = vec![usize::MAX; self.rules.len()];
        loop {
            let mut changed = false;
            for (i, alts) in self.rules.iter().enumerate() {
                for a in alts {
                    let c = self.alt_cost(a, &cost);
                    if c < cost[i] {
                        cost[i] = c;
                        changed = true;
                    }
                }
            }
            if !changed {
                return cost;
            }
        }
    }

    fn alt_cost(&self, alt: &[Item], cost: &[usize]) -> usize {
        alt.iter().fold(0usize, |acc, it| {
            let c = match it {
                Item::Ref(r) => cost[*r as usize],
                _ => 1,
            };
            acc.saturating_add(c)
        })
    }

    fn expand(
        &self,
        rule: u32,
        depth: usize,
        cost: &[usize],
        rng: &mut Rng,
        out: &mut String,
    ) -> Option<()> {
        let alts = &self.rules[rule as usize];
        let finite: Vec<&Vec<Item>> = alts
            .iter()
            .filter(|a| self.alt_cost(a, cost) != usize::MAX)
            .collect();
        let alt = if depth > 24 || out.len() > 2000 {
            *finite.iter().min_by_key(|a| self.alt_cost(a, cost))?
        } else {
            finite[rng.below(finite.len())]
        };
        for it in alt {
            match it {
                Item::Class(c) => out.push(pick(c, rng)?),
                Item::Any => out.push(POOL[rng.below(POOL.len())]),
                Item::Ref(r) => self.expand(*r, depth + 1, cost, rng, out)?,
                Item::Token { .. } => return None,
            }
        }
        Some(())
    }
}

fn pick(c: &CharClass, rng: &mut Rng) -> Option<char> {
    if c.negated {
        let ok: Vec<char> = POOL
            .iter()
            .copied()
            .filter(|&p| c.matches(p as u32))
            .collect();
        return ok.get(rng.below(ok.len())).copied();
    }
    let &(lo, hi) = c.ranges.get(rng.below(c.ranges.len()))?;
    let span = (hi - lo) as usize + 1;
    char::from_u32(lo + rng.below(span) as u32).or_else(|| char::from_u32(lo))
}

#[cfg(test)]
mod tests {
    use crate::{Grammar, Matcher, TokenTrie};
    use std::sync::Arc;

    #[test]
    fn samples_belong_to_the_language() {
        let g = Grammar::parse(
            "root ::= \"[\" (item (\",\" item)*)? \"]\"\nitem ::= [0-9]+ | \"\\\"\" [^\"]* \"\\\"\" | root",
            None,
        )
        .unwrap();
        for seed in 0..50 {
            let s = g.sample(seed).unwrap();
            let mut m = Matcher::new(&g, Arc::new(TokenTrie::new(0, |_| &[][..], &[])));
            assert!(m.accept_text(&s) && m.accepts_end(), "{s}");
        }
    }
}
