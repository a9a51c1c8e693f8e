//! CPU lists as the kernel writes them (`"0-1,4,6-7"`: `[daemon] cpus`), and
//! pinning to them.

/// The most CPUs a list may name (the kernel's `CPU_SETSIZE`).
pub const MAX_CPUS: usize = 1024;

/// Parses a CPU list: numbers and inclusive ranges `a-b` separated by
/// commas, spaces allowed around each; the CPUs in ascending order, each
/// once. Empty lists, reversed ranges and CPUs at or above [`MAX_CPUS`]
/// are errors.
pub fn parse(list: &str) -> Result<Vec<usize>, String> {
    let mut cpus = Vec::new();
    for part in list.split(',') {
        let part = part.trim();
        let num = |s: &str| {
            s.trim()
                .parse::<usize>()
                .map_err(|_| format!("{s:?} is not a CPU number"))
        };
        let (lo, hi) = match part.split_once('-') {
            Some((a, b)) => (num(a)?, num(b)?),
            None if part.is_empty() => return Err("an empty entry".into()),
            None => {
                let n = num(part)?;
                (n, n)
            }
        };
        if lo > hi {
            return Err(format!("the range {part:?} runs backwards"));
        }
        if hi >= MAX_CPUS {
            return Err(format!(
                "CPU {hi} is past the last possible CPU ({})",
                MAX_CPUS - 1
            ));
        }
        cpus.extend(lo..=hi);
    }
    cpus.sort_unstable();
    cpus.dedup();
    Ok(cpus)
}

/// Pins the calling thread to `cpus`; threads it starts and processes it
/// spawns after this inherit the mask.
pub fn pin_current_thread(cpus: &[usize]) -> Result<(), String> {
    pin_task(0, cpus)
}

/// Pins the thread (or process's main thread) `tid` to `cpus`; 0 is the
/// calling thread.
pub fn pin_task(tid: i32, cpus: &[usize]) -> Result<(), String> {
    use nix::sched::{sched_setaffinity, CpuSet};
    let mut set = CpuSet::new();
    for &c in cpus {
        set.set(c).map_err(|e| format!("CPU {c}: {e}"))?;
    }
    sched_setaffinity(nix::unistd::Pid::from_raw(tid), &set).map_err(|e| match e {
        nix::errno::Errno::EINVAL => {
            "none of these CPUs is online and allowed to this process".into()
        }
        e => e.to_string(),
    })
}

/// A host that reserves `reserved` for its own threads out of `allowed`
/// (the CPUs this process may use): the reserved CPUs and the rest, where
/// the VMs run. Every reserved CPU must be allowed and at least one must be
/// left over.
pub fn split(reserved: &[usize], allowed: &[usize]) -> Result<(Vec<usize>, Vec<usize>), String> {
    if let Some(c) = reserved.iter().find(|c| !allowed.contains(c)) {
        return Err(format!(
            "CPU {c} is not one this process may use ({})",
            format(allowed)
        ));
    }
    let rest: Vec<usize> = allowed
        .iter()
        .copied()
        .filter(|c| !reserved.contains(c))
        .collect();
    if rest.is_empty() {
        return Err(format!(
            "it leaves no CPU for the VMs (this process may use {})",
            format(allowed)
        ));
    }
    Ok((reserved.to_vec(), rest))
}

/// The CPUs the calling thread may run on.
pub fn current() -> Vec<usize> {
    use nix::sched::sched_getaffinity;
    sched_getaffinity(nix::unistd::Pid::from_raw(0))
        .map(|set| {
            (0..MAX_CPUS)
                .filter(|&c| set.is_set(c).unwrap_or(false))
                .collect()
        })
        .unwrap_or_default()
}

/// `cpus` written back as a list, ranges joined (`[0, 1, 4]` -> `"0-1,4"`).
pub fn format(cpus: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            cpus[i].to_string()
        } else {
            format!("{}-{}", cpus[i], cpus[j])
        });
        i = j + 1;
    }
    out.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_parse_as_the_kernel_writes_them() {
        assert_eq!(parse("0-1").unwrap(), [0, 1]);
        assert_eq!(parse("3").unwrap(), [3]);
        assert_eq!(parse("6-7, 0,2-3 ,2").unwrap(), [0, 2, 3, 6, 7]);
        assert_eq!(parse("5-5").unwrap(), [5]);
        assert_eq!(parse("1023").unwrap(), [1023]);
    }

    #[test]
    fn bad_lists_say_what_is_wrong() {
        for (bad, says) in [
            ("", "empty"),
            ("0,,1", "empty"),
            ("1-0", "backwards"),
            ("a", "not a CPU number"),
            ("0-", "not a CPU number"),
            ("-1", "not a CPU number"),
            ("0-1024", "past the last"),
            ("1.5", "not a CPU number"),
        ] {
            let e = parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad:?}: {e}");
        }
    }

    #[test]
    fn lists_format_back_with_ranges() {
        assert_eq!(format(&[0, 1, 4, 6, 7, 8]), "0-1,4,6-8");
        assert_eq!(format(&[2]), "2");
        assert_eq!(format(&[]), "");
        assert_eq!(parse(&format(&[0, 2, 3, 9])).unwrap(), [0, 2, 3, 9]);
    }

    #[test]
    fn a_reservation_splits_the_allowed_cpus_or_says_why_not() {
        let allowed = [0, 1, 2, 3, 6];
        assert_eq!(
            split(&[0, 1], &allowed).unwrap(),
            (vec![0, 1], vec![2, 3, 6])
        );
        assert_eq!(split(&[6], &allowed).unwrap(), (vec![6], vec![0, 1, 2, 3]));
        let e = split(&[4], &allowed).unwrap_err();
        assert!(e.contains("CPU 4") && e.contains("0-3,6"), "{e}");
        let e = split(&allowed, &allowed).unwrap_err();
        assert!(e.contains("no CPU for the VMs"), "{e}");
    }

    #[test]
    fn a_thread_pins_itself_and_its_mask_reads_back() {
        let allowed = current();
        assert!(!allowed.is_empty());
        let one = allowed[0];
        std::thread::spawn(move || {
            pin_current_thread(&[one]).unwrap();
            assert_eq!(current(), [one]);
            // A CPU past every online one is refused with the reason.
            let e = pin_current_thread(&[MAX_CPUS - 1]).unwrap_err();
            assert!(e.contains("online"), "{e}");
        })
        .join()
        .unwrap();
    }
}
