//! Embedding requests: which of a prompt's final-norm rows a pooling reads, how it pools them,
//! and llama.cpp's normalizations of the result (`embd_normalize`).

/// How a prompt's final-norm rows become its embedding (llama.cpp's `--pooling`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pooling {
    /// Every row, one per token.
    None,
    /// The mean of the rows.
    Mean,
    /// The first row.
    Cls,
    /// The last row.
    Last,
}

impl Pooling {
    /// llama.cpp's name.
    pub fn name(self) -> &'static str {
        match self {
            Pooling::None => "none",
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
            Pooling::Last => "last",
        }
    }

    /// Whether the row of the token at `pos` of a prompt of `n` tokens is read.
    pub fn reads(self, pos: usize, n: usize) -> bool {
        match self {
            Pooling::None | Pooling::Mean => true,
            Pooling::Cls => pos == 0,
            Pooling::Last => pos + 1 == n,
        }
    }

    /// The embedding of the rows read (`n_embd` values each, in prompt order): one row per token
    /// for `None`, one row otherwise.
    pub fn pool(self, rows: &[f32], n_embd: usize) -> Vec<Vec<f32>> {
        let each = rows.chunks_exact(n_embd.max(1));
        match self {
            Pooling::None => each.map(<[f32]>::to_vec).collect(),
            Pooling::Mean => {
                let n = each.len().max(1) as f32;
                let mut sum = vec![0f32; n_embd];
                for row in each {
                    for (s, &x) in sum.iter_mut().zip(row) {
                        *s += x;
                    }
                }
                vec![sum.into_iter().map(|s| s / n).collect()]
            }
            Pooling::Cls => each.take(1).map(<[f32]>::to_vec).collect(),
            Pooling::Last => each.last().map(<[f32]>::to_vec).into_iter().collect(),
        }
    }
}

/// `row` normalized as llama.cpp's `common_embd_normalize` does for `norm`: -1 none, 0 the
/// largest magnitude to 32760 (the int16 range), 2 Euclidean, any other p the p-norm (1:
/// taxicab). A zero norm leaves zeros.
pub fn normalize(row: &[f32], norm: i32) -> Vec<f32> {
    let sum: f64 = match norm {
        -1 => 1.0,
        0 => row.iter().fold(0f64, |m, &x| m.max(f64::from(x.abs()))) / 32760.0,
        2 => row.iter().map(|&x| f64::from(x * x)).sum::<f64>().sqrt(),
        p => row
            .iter()
            .map(|&x| f64::from(x.abs()).powi(p))
            .sum::<f64>()
            .powf(1.0 / f64::from(p)),
    };
    let scale = if sum > 0.0 { (1.0 / sum) as f32 } else { 0.0 };
    row.iter().map(|&x| x * scale).collect()
}

#[cfg(test)]
mod tests {
    use super::{normalize, Pooling};

    const ROWS: [f32; 6] = [1.0, -2.0, 3.0, 4.0, 0.5, -1.0];

    #[test]
    fn each_pooling_reads_and_pools_its_rows() {
        assert_eq!(Pooling::None.pool(&ROWS, 2).len(), 3);
        assert_eq!(Pooling::Mean.pool(&ROWS, 2), [[1.5, 1.0 / 3.0]]);
        assert_eq!(Pooling::Cls.pool(&ROWS, 2), [[1.0, -2.0]]);
        assert_eq!(Pooling::Last.pool(&ROWS, 2), [[0.5, -1.0]]);
        let read = |p: Pooling| (0..3).filter(|&i| p.reads(i, 3)).collect::<Vec<_>>();
        assert_eq!(read(Pooling::Mean), [0, 1, 2]);
        assert_eq!(read(Pooling::Cls), [0]);
        assert_eq!(read(Pooling::Last), [2]);
    }

    #[test]
    fn normalizations_follow_llama_cpp() {
        assert_eq!(normalize(&[3.0, -4.0], 2), [0.6, -0.8]);
        assert_eq!(normalize(&[3.0, -4.0], -1), [3.0, -4.0]);
        let taxicab = normalize(&[3.0, -4.0], 1);
        assert!((taxicab[0] - 3.0 / 7.0).abs() < 1e-7 && (taxicab[1] + 4.0 / 7.0).abs() < 1e-7);
        assert_eq!(normalize(&[1.0, -2.0], 0), [16380.0, -32760.0]);
        let p3 = normalize(&[1.0, 2.0], 3);
        let n = (1f64 + 8.0).powf(1.0 / 3.0) as f32;
        assert!((p3[1] - 2.0 / n).abs() < 1e-6, "{p3:?}");
        assert_eq!(normalize(&[0.0, 0.0], 2), [0.0, 0.0]);
    }
}
