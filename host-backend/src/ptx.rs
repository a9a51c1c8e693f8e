//! Just enough PTX reading to know a module's kernels and the byte size of
//! each kernel parameter (needed to marshal `cuLaunchKernel` arguments).

use std::collections::HashMap;

/// Kernel name -> parameter sizes in bytes, in order.
pub type Entries = HashMap<String, Vec<u32>>;

/// Parses `.entry` declarations. Returns `None` if the text is not PTX-like.
pub fn entries(ptx: &str) -> Option<Entries> {
    if !ptx.contains(".version") || !ptx.contains(".target") {
        return None;
    }
    let mut out = HashMap::new();
    let mut rest = ptx;
    while let Some(i) = rest.find(".entry") {
        rest = &rest[i + ".entry".len()..];
        let open = rest.find('(')?;
        let name = rest[..open].trim().to_owned();
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$')
        {
            return None;
        }
        let close = rest[open..].find(')')? + open;
        let params = &rest[open + 1..close];
        let mut sizes = Vec::new();
        for p in params.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            sizes.push(param_size(p)?);
        }
        out.insert(name, sizes);
        rest = &rest[close..];
    }
    Some(out)
}

/// Module-scope `.global` variables: (name, size in bytes).
pub fn globals(ptx: &str) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    for line in ptx.lines() {
        let t = line.trim();
        let decl = t
            .trim_start_matches(".visible")
            .trim_start_matches(".extern")
            .trim_start();
        let Some(rest) = decl.strip_prefix(".global") else {
            continue;
        };
        let rest = rest.split(['=', ';']).next().unwrap_or("");
        let toks: Vec<&str> = rest
            .split_whitespace()
            .filter(|t| *t != ".align" && t.parse::<u32>().is_err())
            .collect();
        let (Some(ty), Some(name)) = (toks.iter().find(|t| t.starts_with('.')), toks.last()) else {
            continue;
        };
        let elem: u64 = match ty.get(2..) {
            Some("8") => 1,
            Some("16") => 2,
            Some("32") => 4,
            Some("64") => 8,
            _ => continue,
        };
        let (base, count) = match (name.find('['), name.find(']')) {
            (Some(a), Some(b)) if b > a => (&name[..a], name[a + 1..b].parse::<u64>().unwrap_or(0)),
            _ => (*name, 1),
        };
        if count > 0 && !base.is_empty() {
            out.push((base.to_owned(), elem * count));
        }
    }
    out
}

fn param_size(decl: &str) -> Option<u32> {
    // e.g. ".param .u64 name", ".param .align 8 .b8 name[24]", ".param .f32 x"
    let toks: Vec<&str> = decl.split_whitespace().collect();
    let ty = toks.iter().find(|t| {
        t.starts_with('.')
            && *t != &".param"
            && *t != &".align"
            && *t != &".ptr"
            && !t.starts_with(".global")
    })?;
    let elem: u32 = match &ty[2..] {
        "8" => 1,
        "16" => 2,
        "32" => 4,
        "64" => 8,
        _ => return None,
    };
    let name = toks.last()?;
    let count = match (name.find('['), name.find(']')) {
        (Some(a), Some(b)) if b > a => name[a + 1..b].parse::<u32>().ok()?,
        _ => 1,
    };
    elem.checked_mul(count)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_shipped_kernels() {
        let e = entries(include_str!("../kernels/fairvgpu.ptx")).unwrap();
        assert_eq!(e["vector_add"], vec![8, 8, 8, 4]);
        assert_eq!(e["saxpy"], vec![4, 8, 8, 4]);
        assert_eq!(e["spin_ns"], vec![8]);
        assert_eq!(e["empty"], Vec::<u32>::new());
        assert_eq!(e["atomic_count"], vec![8]);
        assert_eq!(
            globals(include_str!("../kernels/fairvgpu.ptx")),
            vec![("fvg_counter".to_string(), 4)]
        );
    }

    #[test]
    fn globals_are_found_and_instructions_ignored() {
        let g = globals(".version 7.0\n.target sm_70\n.visible .global .align 4 .b8 table[64];\n.global .u32 counter = 5;\nld.global.f32 %f1, [%rd1];\n");
        assert_eq!(
            g,
            vec![("table".to_string(), 64), ("counter".to_string(), 4)]
        );
    }

    #[test]
    fn arrays_and_garbage() {
        let e = entries(
            ".version 7.0\n.target sm_70\n.entry k(.param .align 8 .b8 s[24], .param .u16 h)\n{}",
        )
        .unwrap();
        assert_eq!(e["k"], vec![24, 2]);
        assert!(entries("not ptx").is_none());
        assert!(entries(".version 1\n.target x\n.entry (").is_none());
        assert!(entries(".version 1\n.target x\n.entry k(.param .u128 x)").is_none());
    }
}
