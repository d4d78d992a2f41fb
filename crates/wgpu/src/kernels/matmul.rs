//! The matmul kernel's tile widths: matmul.wgsl with its per-token lines written out
//! for a tile of 1, 4 or 8 tokens, so every register of the tile is a named variable
//! (no per-thread array) whatever the width.

const TEMPLATE: &str = include_str!("matmul.wgsl");

/// Tokens per workgroup of a matmul dispatch. Every width sums each output in the
/// same order, so the choice never changes a result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Tile {
    /// 1 token: a decode step of one sequence, scalar sums (no lanes of repeats).
    Single,
    /// 4 tokens: short batches.
    Narrow,
    /// 8 tokens: prompts, where a decoded weight serves twice as many tokens.
    Wide,
}

impl Tile {
    /// The width for `nt` tokens.
    pub(crate) fn for_tokens(nt: usize) -> Tile {
        match nt {
            0 | 1 => Tile::Single,
            2..=7 => Tile::Narrow,
            _ => Tile::Wide,
        }
    }

    /// Tokens per workgroup.
    pub(crate) fn tokens(self) -> usize {
        match self {
            Tile::Single => 1,
            Tile::Narrow => 4,
            Tile::Wide => 8,
        }
    }
}

/// matmul.wgsl for `tile`, its marked lines written out.
pub(crate) fn source(tile: Tile) -> String {
    let tt = tile.tokens();
    // A one-token tile sums in f32 scalars, the wider ones in vec4s of tokens; both
    // do the same IEEE operations on each output.
    let single = tt == 1;
    let nv = tt.div_ceil(4);
    let acc = if single { "f32" } else { "vec4<f32>" };
    let comp = ["x", "y", "z", "w"];
    let mut setup = String::new();
    for j in 0..tt {
        setup += &format!("    let tk{j} = t0 + min({j}u, tn - 1u);\n");
        setup += &format!("    let b{j} = x_base(tk{j});\n");
    }
    for r in 0..4 {
        for v in 0..nv {
            setup += &format!("    var a{r}_{v} = {acc}(0.0);\n");
        }
    }
    let mut scales = String::new();
    for j in 0..tt {
        scales += &format!("        let sc{j} = x_scale(tk{j}, c);\n");
    }
    let mut sums = String::new();
    for r in 0..4 {
        for v in 0..nv {
            scales += &format!("        var s{r}_{v} = {acc}(0.0);\n");
            sums += &format!("        a{r}_{v} += s{r}_{v};\n");
        }
    }
    let mut products = String::new();
    for j in 0..tt {
        products += &format!("            let x{j} = x_group(b{j}, sc{j}, e);\n");
    }
    for c in comp {
        for r in 0..4 {
            for v in 0..nv {
                if single {
                    products += &format!("            s{r}_0 += w{r}.{c} * x0.{c};\n");
                    continue;
                }
                let xs: Vec<String> = (0..4).map(|i| format!("x{}.{c}", 4 * v + i)).collect();
                products += &format!(
                    "            s{r}_{v} += vec4<f32>(w{r}.{c}) * vec4<f32>({});\n",
                    xs.join(", ")
                );
            }
        }
    }
    let mut parts = String::new();
    for r in 0..4 {
        for v in 0..nv {
            let a = if single {
                format!("vec4<f32>(a{r}_{v}, 0.0, 0.0, 0.0)")
            } else {
                format!("a{r}_{v}")
            };
            parts += &format!("    part[{}u * WG + lid] = {a};\n", r * nv + v);
        }
    }
    TEMPLATE
        .replace("{{TT}}", &tt.to_string())
        .replace("{{NV}}", &nv.to_string())
        .replace("{{PART}}", &(4 * nv * 64).to_string())
        .replacen("{{SETUP}}\n", &setup, 1)
        .replacen("{{SCALES}}\n", &scales, 1)
        .replacen("{{PRODUCTS}}\n", &products, 1)
        .replacen("{{SUMS}}\n", &sums, 1)
        .replacen("{{PARTS}}\n", &parts, 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_marker_is_written_out_for_both_widths() {
        for tile in [Tile::Single, Tile::Narrow, Tile::Wide] {
            let src = source(tile);
            for line in src.lines().filter(|l| !l.trim_start().starts_with("//")) {
                assert!(!line.contains("{{"), "{tile:?}: unexpanded line {line}");
            }
            let last = tile.tokens() - 1;
            assert!(src.contains(&format!("let x{last} = x_group(")), "{tile:?}");
        }
    }

    #[test]
    fn prompts_take_the_wide_tile_and_decode_the_single_one() {
        assert_eq!(Tile::for_tokens(1), Tile::Single);
        assert_eq!(Tile::for_tokens(2), Tile::Narrow);
        assert_eq!(Tile::for_tokens(7), Tile::Narrow);
        assert_eq!(Tile::for_tokens(8), Tile::Wide);
        assert_eq!(Tile::for_tokens(512), Tile::Wide);
    }
}
