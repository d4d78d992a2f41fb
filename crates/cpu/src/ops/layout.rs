//! Layout ops of the IR vocabulary (reshape, view, permute), materialized as copies.

/// `out = x[offset .. offset + out.len()]` (reshape is a view at offset 0).
pub fn view(x: &[f32], offset: usize, out: &mut [f32]) -> Result<(), String> {
    let src = offset
        .checked_add(out.len())
        .and_then(|end| x.get(offset..end))
        .ok_or_else(|| format!("view {offset}+{} outside {} values", out.len(), x.len()))?;
    out.copy_from_slice(src);
    Ok(())
}

/// Moves source axis `i` to destination axis `dims[i]`; `out_shape` is the result's shape.
pub fn permute(
    x: &[f32],
    out_shape: [usize; 4],
    dims: [usize; 4],
    out: &mut [f32],
) -> Result<(), String> {
    let mut in_shape = [0; 4];
    for i in 0..4 {
        in_shape[i] = *out_shape
            .get(dims[i])
            .ok_or_else(|| format!("permute: axis {} out of range", dims[i]))?;
    }
    let n: usize = out_shape.iter().product();
    if x.len() < n || out.len() < n {
        return Err(format!(
            "permute: {} inputs / {} outputs for {n}",
            x.len(),
            out.len()
        ));
    }
    let os = [
        1,
        out_shape[0],
        out_shape[0] * out_shape[1],
        out_shape[0] * out_shape[1] * out_shape[2],
    ];
    for (idx, &v) in x[..n].iter().enumerate() {
        let (mut r, mut o) = (idx, 0);
        for i in 0..4 {
            let e = in_shape[i].max(1);
            o += (r % e) * os[dims[i]];
            r /= e;
        }
        *out.get_mut(o)
            .ok_or_else(|| format!("permute: dims {dims:?} are not a permutation"))? = v;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn view_and_transpose() {
        let x = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0];
        let mut y = [0.0; 3];
        view(&x, 2, &mut y).unwrap();
        assert_eq!(y, [2.0, 3.0, 4.0]);
        assert!(view(&x, 4, &mut y).is_err());
        // x is [3, 2]; swapping the axes gives [2, 3].
        let mut t = [0.0; 6];
        permute(&x, [2, 3, 1, 1], [1, 0, 2, 3], &mut t).unwrap();
        assert_eq!(t, [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    }
}
