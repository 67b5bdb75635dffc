//! llama.cpp's card flags `-dev`, `-ts`, `-mg` and `-sm`, with the value syntax of `arg.cpp`
//! (serve, run, plan) or of `llama-bench` (bench, where a comma separates values to sweep),
//! read into a [`CardRequest`]. bloomery splits routed experts across cards, never layers or
//! rows: `-sm layer` (llama.cpp's default) is taken as that split, `-sm row` and `-sm tensor`
//! are refused by name.

use bloomery_tiering::cards::CardRequest;

/// Whose value syntax the flags follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Syntax {
    /// `common/arg.cpp`: `-dev A,B`, `-ts 3,1` (or `3/1`).
    Common,
    /// `llama-bench`: `-dev A/B`, `-ts 3;1` (or `3/1`); a comma separates values to sweep.
    Bench,
}

/// The card flags as given.
#[derive(Clone, Copy, Debug, Default)]
pub struct CardFlags<'a> {
    /// `-dev`.
    pub device: Option<&'a str>,
    /// `-ts`.
    pub tensor_split: Option<&'a str>,
    /// `-mg`.
    pub main_gpu: Option<&'a str>,
    /// `-sm`.
    pub split_mode: Option<&'a str>,
}

impl CardFlags<'_> {
    /// The request these flags make under `syntax`; a value bloomery does not take is refused
    /// in one line naming the flag and the value.
    pub fn request(&self, syntax: Syntax) -> Result<CardRequest, String> {
        if syntax == Syntax::Bench {
            let given = [
                ("-dev", self.device),
                ("-ts", self.tensor_split),
                ("-mg", self.main_gpu),
                ("-sm", self.split_mode),
            ];
            if let Some((flag, Some(v))) = given
                .iter()
                .find(|(_, v)| v.is_some_and(|v| v.contains(',')))
            {
                return Err(format!(
                    "{flag} {v}: not supported by bloomery bench: sweeping card settings is not \
                     implemented (give one value)"
                ));
            }
        }
        let main_only = match self.split_mode {
            None | Some("layer") => false,
            Some("none") => true,
            Some(v @ ("row" | "tensor")) => {
                return Err(format!(
                    "-sm {v}: not supported: bloomery splits routed experts across cards (the \
                     main card keeps the dense weights and the KV cache), not weights by rows \
                     or tensors; -sm layer (the default) splits the experts, -sm none uses the \
                     main card only"
                ))
            }
            Some(v) => {
                return Err(format!(
                    "-sm {v}: invalid value (none, layer, row or tensor)"
                ))
            }
        };
        let main = match self.main_gpu {
            None => 0,
            Some(v) => v
                .trim()
                .parse::<u32>()
                .map_err(|_| format!("-mg {v}: expected a card index (0, 1, …)"))?,
        };
        Ok(CardRequest {
            devices: self.device.map(|v| devices(v, syntax)).transpose()?,
            main,
            split: match self.tensor_split {
                None => Vec::new(),
                Some(v) => shares(v, syntax)?,
            },
            main_only,
        })
    }
}

/// `-dev`'s device indices from llama.cpp's device names (`CUDA0`, `CUDA1`).
fn devices(value: &str, syntax: Syntax) -> Result<Vec<u32>, String> {
    let sep = match syntax {
        Syntax::Common => ',',
        Syntax::Bench => '/',
    };
    let names: Vec<&str> = value.split(sep).filter(|s| !s.is_empty()).collect();
    if names.is_empty() {
        return Err(format!("-dev {value:?}: no devices specified"));
    }
    if names == ["none"] {
        return Err(
            "-dev none: not supported: the model runs on the best kernel plugin's device; -ngl 0 \
             runs it on the CPU"
                .into(),
        );
    }
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        let index = name
            .get(..4)
            .filter(|p| p.eq_ignore_ascii_case("cuda"))
            .and_then(|_| name[4..].parse::<u32>().ok())
            .ok_or_else(|| {
                format!(
                    "-dev {name}: invalid device (CUDA0, CUDA1, …; `bloomery plugins` lists them)"
                )
            })?;
        if out.contains(&index) {
            return Err(format!("-dev {value}: {name} is named twice"));
        }
        out.push(index);
    }
    Ok(out)
}

/// `-ts`'s proportions, one a card (`3,1` or `3/1`; llama-bench: `3;1` or `3/1`).
fn shares(value: &str, syntax: Syntax) -> Result<Vec<f32>, String> {
    let seps: &[char] = match syntax {
        Syntax::Common => &[',', '/'],
        Syntax::Bench => &[';', '/'],
    };
    value
        .split(seps)
        .filter(|s| !s.is_empty())
        .map(|s| match s.trim().parse::<f32>() {
            Ok(x) if x >= 0.0 && x.is_finite() => Ok(x),
            _ => Err(format!(
                "-ts {value}: {s:?} is not a proportion (a number, 0 or more)"
            )),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(
        d: Option<&str>,
        ts: Option<&str>,
        mg: Option<&str>,
        sm: Option<&str>,
        s: Syntax,
    ) -> Result<CardRequest, String> {
        CardFlags {
            device: d,
            tensor_split: ts,
            main_gpu: mg,
            split_mode: sm,
        }
        .request(s)
    }

    #[test]
    fn llama_cpp_spellings_read_as_arg_cpp_and_llama_bench_write_them() {
        use Syntax::{Bench, Common};
        assert_eq!(
            req(None, None, None, None, Common).unwrap(),
            CardRequest::default()
        );
        let r = req(
            Some("CUDA1,cuda0"),
            Some("3,1"),
            Some("1"),
            Some("layer"),
            Common,
        )
        .unwrap();
        assert_eq!(r.devices, Some(vec![1, 0]));
        assert_eq!(
            (r.split.clone(), r.main, r.main_only),
            (vec![3.0, 1.0], 1, false)
        );
        assert_eq!(
            req(None, Some("3/1"), None, None, Common).unwrap().split,
            [3.0, 1.0]
        );
        assert!(
            req(None, None, None, Some("none"), Common)
                .unwrap()
                .main_only
        );
        // llama-bench: '/' within one value, ',' between values to sweep.
        let r = req(Some("CUDA0/CUDA1"), Some("1;1"), None, None, Bench).unwrap();
        assert_eq!((r.devices, r.split), (Some(vec![0, 1]), vec![1.0, 1.0]));
        let e = req(None, Some("1;1,3;1"), None, None, Bench).unwrap_err();
        assert!(
            e.starts_with("-ts 1;1,3;1: not supported by bloomery bench"),
            "{e}"
        );
        assert!(req(Some("CUDA0,CUDA1"), None, None, None, Bench).is_err());
    }

    #[test]
    fn what_bloomery_does_not_do_is_refused_naming_flag_and_value() {
        use Syntax::Common;
        for (sm, start) in [
            ("row", "-sm row: not supported"),
            ("tensor", "-sm tensor: not supported"),
            ("rows", "-sm rows: invalid"),
        ] {
            let e = req(None, None, None, Some(sm), Common).unwrap_err();
            assert!(e.starts_with(start), "{e}");
        }
        let e = req(Some("none"), None, None, None, Common).unwrap_err();
        assert!(e.starts_with("-dev none: not supported"), "{e}");
        let e = req(Some("Vulkan0"), None, None, None, Common).unwrap_err();
        assert!(e.starts_with("-dev Vulkan0: invalid device"), "{e}");
        let e = req(Some("CUDA0,CUDA0"), None, None, None, Common).unwrap_err();
        assert!(e.contains("named twice"), "{e}");
        let e = req(None, Some("3,-1"), None, None, Common).unwrap_err();
        assert!(e.starts_with("-ts 3,-1: \"-1\" is not a proportion"), "{e}");
        let e = req(None, None, Some("-1"), None, Common).unwrap_err();
        assert!(e.starts_with("-mg -1"), "{e}");
    }
}
