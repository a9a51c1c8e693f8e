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

/// The `.entry` names in the order the text declares them, each once (the
/// order in which the driver visits a module's kernels).
pub fn entry_names(ptx: &str, entries: &Entries) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for part in ptx.split(".entry").skip(1) {
        let Some(open) = part.find('(') else { continue };
        let name = part[..open].trim();
        if entries.contains_key(name) && !names.iter().any(|n| n == name) {
            names.push(name.to_owned());
        }
    }
    names
}

/// The offsets of parameters of `sizes` bytes in a kernel's parameter
/// buffer: each aligned to its size (up to 8), as the scalar and pointer
/// parameters of PTX entries are.
pub fn layout(sizes: &[u32]) -> Vec<protocol::Param> {
    let mut at = 0u32;
    sizes
        .iter()
        .map(|&size| {
            let align = size.clamp(1, 8).next_power_of_two();
            at = at.next_multiple_of(align);
            let p = protocol::Param { offset: at, size };
            at += size;
            p
        })
        .collect()
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

/// Suffix of an entry's sliceable variant.
pub const SLICE_SUFFIX: &str = "__fvg_slice";

/// Appends to a PTX module, for every kernel that reads its block index
/// only through `mov %r, %ctaid.x` / `mov %r, %nctaid.x`, a variant
/// `<name>__fvg_slice` with two more parameters (the first x block of the
/// sub-grid, and the whole grid's x size) that sees the block indices of
/// the whole grid: a launch of the variant over x blocks [off, off + n)
/// does what those blocks of the original launch do. Kernel slicing runs a
/// large grid as several such sub-grids, so that the GPU can change hands
/// between them. `None` if no kernel qualifies.
pub fn with_slice_variants(ptx: &str) -> Option<String> {
    let mut extra = String::new();
    let mut rest = ptx;
    let mut base = 0usize;
    while let Some(i) = rest.find(".entry") {
        let at = base + i;
        let tail = &ptx[at + ".entry".len()..];
        let open = tail.find('(')?;
        let name = tail[..open].trim().to_owned();
        let close = tail[open..].find(')')? + open;
        let params = tail[open + 1..close].trim().to_owned();
        let brace = tail[close..].find('{')? + close;
        let directives = tail[close + 1..brace].to_owned();
        // The body: up to the matching brace.
        let mut depth = 0usize;
        let mut end = None;
        for (k, ch) in tail[brace..].char_indices() {
            match ch {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = Some(brace + k);
                        break;
                    }
                }
                _ => {}
            }
        }
        let end = end?;
        let body = &tail[brace + 1..end];
        if let Some(new_body) = slice_body(body, &name) {
            let sep = if params.is_empty() { "" } else { ",\n\t" };
            extra.push_str(&format!(
                "\n.visible .entry {name}{SLICE_SUFFIX}(\n\t{params}{sep}.param .u32 {name}__fvg_xoff,\n\t.param .u32 {name}__fvg_nx\n){directives}{{\n\t.reg .b32 \t%fvg_t;\n{new_body}}}\n"
            ));
        }
        let consumed = at + ".entry".len() + end;
        base = consumed;
        rest = &ptx[consumed..];
    }
    if extra.is_empty() {
        return None;
    }
    let trimmed = ptx.trim_end_matches('\0');
    Some(format!(
        "{trimmed}\n// Kernel slicing variants (fairvgpu).{extra}"
    ))
}

/// Rewrites a kernel body's reads of `%ctaid.x` and `%nctaid.x`; `None` if
/// it reads them any other way (or not at all).
fn slice_body(body: &str, name: &str) -> Option<String> {
    if !body.contains("%ctaid.x") {
        return None;
    }
    let mut out = String::new();
    for line in body.lines() {
        let t = line.trim();
        if !t.contains("ctaid.x") {
            out.push_str(line);
            out.push('\n');
            continue;
        }
        // Only `mov.{u32,b32,s32} %reg, %ctaid.x;` (or %nctaid.x).
        let inst = t.strip_suffix(';')?.trim();
        let (op, args) = inst.split_once(char::is_whitespace)?;
        if !matches!(op, "mov.u32" | "mov.b32" | "mov.s32") {
            return None;
        }
        let (dst, src) = args.split_once(',')?;
        let (dst, src) = (dst.trim(), src.trim());
        if !dst.starts_with('%') || dst.contains(char::is_whitespace) {
            return None;
        }
        match src {
            "%ctaid.x" => out.push_str(&format!(
                "\t{op} \t{dst}, %ctaid.x;\n\tld.param.u32 \t%fvg_t, [{name}__fvg_xoff];\n\tadd.u32 \t{dst}, {dst}, %fvg_t;\n"
            )),
            "%nctaid.x" => out.push_str(&format!(
                "\tld.param.u32 \t{dst}, [{name}__fvg_nx];\n"
            )),
            _ => return None,
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn parameters_are_laid_out_as_c_does() {
        let offsets: Vec<u32> = layout(&[8, 4, 8, 1, 2, 16])
            .iter()
            .map(|p| p.offset)
            .collect();
        assert_eq!(offsets, vec![0, 8, 16, 24, 26, 32]);
        assert!(layout(&[]).is_empty());
    }

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
    fn entry_names_keep_the_texts_order() {
        let ptx = ".version 8.0\n.target sm_90\n.visible .entry zeta(.param .u64 p)\n{\n\tret;\n}\n.visible .entry alpha()\n{\n\tret;\n}\n";
        let e = entries(ptx).unwrap();
        assert_eq!(entry_names(ptx, &e), vec!["zeta", "alpha"]);
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
    fn slice_variants_see_the_whole_grid() {
        let src = include_str!("../kernels/fairvgpu.ptx");
        let out = with_slice_variants(src).unwrap();
        let e = entries(&out).unwrap();
        // vector_add and saxpy read %ctaid.x with a mov: they get variants with
        // two more u32 parameters; kernels without a block index do not.
        assert_eq!(e["vector_add__fvg_slice"], vec![8, 8, 8, 4, 4, 4]);
        assert_eq!(e["saxpy__fvg_slice"], vec![4, 8, 8, 4, 4, 4]);
        assert!(!e.contains_key("spin_ns__fvg_slice"));
        assert!(!e.contains_key("empty__fvg_slice"));
        // The originals are untouched; the variant adds the offset.
        assert_eq!(e["vector_add"], vec![8, 8, 8, 4]);
        let v = &out[out.find("vector_add__fvg_slice").unwrap()..];
        assert!(v.contains("ld.param.u32 \t%fvg_t, [vector_add__fvg_xoff]"));
        assert!(v.contains("add.u32"));
        // Any other use of %ctaid.x makes a kernel unsliceable.
        let odd = ".version 7.0\n.target sm_70\n.visible .entry k(.param .u32 p)\n{\n\tmad.lo.s32 %r1, %ctaid.x, 2, 1;\n\tret;\n}\n";
        assert!(with_slice_variants(odd).is_none());
        let nctaid = ".version 7.0\n.target sm_70\n.visible .entry k()\n{\n\t.reg .b32 %r<3>;\n\tmov.u32 %r1, %ctaid.x;\n\tmov.u32 %r2, %nctaid.x;\n\tret;\n}\n";
        let out = with_slice_variants(nctaid).unwrap();
        assert!(out.contains(".param .u32 k__fvg_xoff,"));
        assert!(out.contains("ld.param.u32 \t%r2, [k__fvg_nx];"));
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
