//! The stages of the sampler chain and their order, named as llama.cpp names them: by name
//! (`top_k`, with the spellings `top-k` and `topk`, and `nucleus`, `temp`, `typ`) or by one
//! letter each (`--sampler-seq`).

/// One configurable stage of the chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Repetition, frequency and presence penalties.
    Penalties,
    /// DRY.
    Dry,
    /// Top-n-sigma.
    TopNSigma,
    /// Top-k.
    TopK,
    /// Locally typical sampling.
    TypicalP,
    /// Top-p.
    TopP,
    /// Min-p.
    MinP,
    /// XTC.
    Xtc,
    /// Temperature (dynamic when a range is set).
    Temperature,
    /// Adaptive-p, which then replaces the final draw.
    AdaptiveP,
}

impl Stage {
    /// The stage's canonical name.
    pub fn name(self) -> &'static str {
        CANONICAL
            .iter()
            .find(|&&(_, s)| s == self)
            .map_or("", |&(n, _)| n)
    }
}

/// llama.cpp's default order.
pub const DEFAULT_ORDER: [Stage; 9] = [
    Stage::Penalties,
    Stage::Dry,
    Stage::TopNSigma,
    Stage::TopK,
    Stage::TypicalP,
    Stage::TopP,
    Stage::MinP,
    Stage::Xtc,
    Stage::Temperature,
];

/// A stage name or letter that names no stage bloomery runs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OrderError {
    /// An unknown name.
    #[error("unknown sampler `{0}` (known: penalties, dry, top_n_sigma, top_k, typ_p, top_p, min_p, xtc, temperature, adaptive_p)")]
    UnknownName(String),
    /// An unknown letter.
    #[error("unknown sampler letter `{0}` (known: e d s k y p m x t a)")]
    UnknownLetter(char),
    /// The fill-in-the-middle stage, which is not implemented.
    #[error("the `infill` sampler is not implemented")]
    Infill,
}

const CANONICAL: [(&str, Stage); 10] = [
    ("penalties", Stage::Penalties),
    ("dry", Stage::Dry),
    ("top_n_sigma", Stage::TopNSigma),
    ("top_k", Stage::TopK),
    ("typ_p", Stage::TypicalP),
    ("top_p", Stage::TopP),
    ("min_p", Stage::MinP),
    ("xtc", Stage::Xtc),
    ("temperature", Stage::Temperature),
    ("adaptive_p", Stage::AdaptiveP),
];

const LETTERS: [(char, Stage); 10] = [
    ('e', Stage::Penalties),
    ('d', Stage::Dry),
    ('s', Stage::TopNSigma),
    ('k', Stage::TopK),
    ('y', Stage::TypicalP),
    ('p', Stage::TopP),
    ('m', Stage::MinP),
    ('x', Stage::Xtc),
    ('t', Stage::Temperature),
    ('a', Stage::AdaptiveP),
];

/// The stage `name` names, in any case: a canonical name, the same with `-` for `_` or with
/// `_` left out, or `nucleus`, `temp`, `typ`.
pub fn stage_named(name: &str) -> Result<Stage, OrderError> {
    let lower = name.to_lowercase();
    if matches!(lower.as_str(), "infill") {
        return Err(OrderError::Infill);
    }
    let alias = match lower.as_str() {
        "nucleus" => Some(Stage::TopP),
        "temp" => Some(Stage::Temperature),
        "typ" => Some(Stage::TypicalP),
        _ => None,
    };
    alias
        .or_else(|| {
            CANONICAL.iter().find_map(|&(c, s)| {
                let spellings = c
                    .contains('_')
                    .then(|| (c.replace('_', "-"), c.replace('_', "")));
                let hit = lower == c
                    || spellings.is_some_and(|(kebab, joined)| lower == kebab || lower == joined);
                hit.then_some(s)
            })
        })
        .ok_or(OrderError::UnknownName(name.to_owned()))
}

/// The stages of a list of names.
pub fn from_names<S: AsRef<str>>(names: &[S]) -> Result<Vec<Stage>, OrderError> {
    names.iter().map(|n| stage_named(n.as_ref())).collect()
}

/// The stages of a string of letters (`edskypmxt` is the default order).
pub fn from_letters(letters: &str) -> Result<Vec<Stage>, OrderError> {
    letters
        .chars()
        .map(|c| match c {
            'i' => Err(OrderError::Infill),
            _ => LETTERS
                .iter()
                .find(|&&(l, _)| l == c)
                .map(|&(_, s)| s)
                .ok_or(OrderError::UnknownLetter(c)),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_letters_and_aliases() {
        assert_eq!(from_letters("edskypmxt").unwrap(), DEFAULT_ORDER);
        let names = [
            "Top-K",
            "topp",
            "nucleus",
            "TEMP",
            "typ",
            "min_p",
            "adaptive-p",
        ];
        assert_eq!(
            from_names(&names).unwrap(),
            [
                Stage::TopK,
                Stage::TopP,
                Stage::TopP,
                Stage::Temperature,
                Stage::TypicalP,
                Stage::MinP,
                Stage::AdaptiveP
            ]
        );
        assert_eq!(
            from_names(&["dryx"]),
            Err(OrderError::UnknownName("dryx".into()))
        );
        assert_eq!(from_letters("kz"), Err(OrderError::UnknownLetter('z')));
        assert_eq!(from_names(&["infill"]), Err(OrderError::Infill));
    }
}
