//! Logit bias (llama.cpp's `logit-bias` stage, first in the chain): adds a fixed amount to the
//! logits of chosen tokens; negative infinity bans a token.

use super::candidates::Candidates;

/// Adds each `(token, bias)` to that token's logit (a token listed twice gets both). Tokens not
/// among the candidates are skipped. Does not allocate.
pub fn apply(cands: &mut Candidates, biases: &[(u32, f32)]) {
    for &(token, bias) in biases {
        // A list filled from the logits holds token `i` at index `i`.
        match cands.data.get_mut(token as usize) {
            Some(t) if t.id == token => t.logit += bias,
            _ => {
                if let Some(t) = cands.data.iter_mut().find(|t| t.id == token) {
                    t.logit += bias;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adds_to_the_named_tokens_and_bans_with_negative_infinity() {
        let mut c = Candidates::default();
        c.fill(&[1.0, 2.0, 3.0]);
        apply(
            &mut c,
            &[(0, 0.5), (2, f32::NEG_INFINITY), (0, 1.0), (9, 4.0)],
        );
        let l: Vec<f32> = c.data.iter().map(|t| t.logit).collect();
        assert_eq!(l, vec![2.5, 2.0, f32::NEG_INFINITY]);
        // After a reordering the token is found by id.
        c.data.swap(0, 1);
        apply(&mut c, &[(1, 1.0)]);
        assert_eq!(c.data[0].logit, 3.0);
    }
}
