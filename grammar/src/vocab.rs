//! The vocabulary as a trie of token pieces (the bytes each token prints, special tokens as their
//! text, as llama.cpp's grammar sees them), so a mask walks each shared prefix once. Built once
//! per model and shared by every request.

/// One trie node: the byte that leads to it, the tokens whose piece ends here and its children.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Node {
    pub(crate) byte: u8,
    /// Range of `TokenTrie::ids` ending here.
    pub(crate) tokens: (u32, u32),
    /// Range of `TokenTrie::nodes` below.
    pub(crate) children: (u32, u32),
}

/// Token pieces in a trie, with the end-of-generation tokens apart.
#[derive(Debug)]
pub struct TokenTrie {
    pub(crate) nodes: Vec<Node>,
    /// Token ids ordered by piece.
    pub(crate) ids: Vec<u32>,
    /// End-of-generation tokens (admitted only where the grammar may end).
    pub(crate) eog: Vec<u32>,
    /// Vocabulary size (mask length).
    pub(crate) n_vocab: usize,
}

impl TokenTrie {
    /// A trie over `n_vocab` tokens; `piece(id)` gives the bytes token `id` prints (special tokens
    /// rendered); `eog` lists the end-of-generation tokens. Tokens with an empty piece or one that
    /// starts with a NUL byte are never admitted; a piece is read up to its first NUL, as
    /// llama.cpp reads it.
    pub fn new<'p>(n_vocab: usize, piece: impl Fn(u32) -> &'p [u8], eog: &[u32]) -> Self {
        let mut pieces: Vec<(&[u8], u32)> = Vec::with_capacity(n_vocab);
        for id in 0..n_vocab as u32 {
            if eog.contains(&id) {
                continue;
            }
            let p = piece(id);
            let p = &p[..p.iter().position(|&b| b == 0).unwrap_or(p.len())];
            if !p.is_empty() {
                pieces.push((p, id));
            }
        }
        pieces.sort_unstable();
        let ids: Vec<u32> = pieces.iter().map(|&(_, id)| id).collect();
        let mut nodes = vec![Node {
            byte: 0,
            tokens: (0, 0),
            children: (0, 0),
        }];
        // Breadth first, so each node's children are contiguous: (node, range of pieces, depth).
        let mut queue = std::collections::VecDeque::from([(0usize, 0usize, pieces.len(), 0usize)]);
        while let Some((n, lo, hi, depth)) = queue.pop_front() {
            let mut i = lo;
            while i < hi && pieces[i].0.len() == depth {
                i += 1;
            }
            nodes[n].tokens = (lo as u32, i as u32);
            let first = nodes.len() as u32;
            while i < hi {
                let b = pieces[i].0[depth];
                let mut j = i;
                while j < hi && pieces[j].0[depth] == b {
                    j += 1;
                }
                let child = nodes.len();
                nodes.push(Node {
                    byte: b,
                    tokens: (0, 0),
                    children: (0, 0),
                });
                queue.push_back((child, i, j, depth + 1));
                i = j;
            }
            nodes[n].children = (first, nodes.len() as u32);
        }
        TokenTrie {
            nodes,
            ids,
            eog: eog.to_vec(),
            n_vocab,
        }
    }

    /// Vocabulary size.
    pub fn n_vocab(&self) -> usize {
        self.n_vocab
    }

    /// Trie nodes (a measure of the work a full mask costs).
    pub fn n_nodes(&self) -> usize {
        self.nodes.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_share_prefixes() {
        let pieces: Vec<&[u8]> = vec![b"ab", b"a", b"abc", b"b", b"", b"\0x", b"ab"];
        let t = TokenTrie::new(pieces.len(), |i| pieces[i as usize], &[3]);
        // root, a, b(under a), c, ... and no node for token 3 (end of generation).
        assert_eq!(t.n_nodes(), 4);
        let a = t.nodes[t.nodes[0].children.0 as usize];
        assert_eq!(a.byte, b'a');
        let ab = t.nodes[a.children.0 as usize];
        let ends: Vec<u32> = t.ids[ab.tokens.0 as usize..ab.tokens.1 as usize].to_vec();
        assert_eq!(ends, vec![0, 6]);
    }
}
