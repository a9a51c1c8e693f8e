//! Hierarchical weights: a tenant's weight split among its active vGPUs.
//!
//! An operator gives a tenant a weight (its share of the GPU against other
//! tenants) and each of its VMs a weight within the tenant. The fair queue
//! itself stays flat: each vGPU runs under an *effective* weight,
//!
//! ```text
//!   effective(v) = tenant_weight(t) * weight(v) / sum of weight(u) over the active vGPUs u of t
//! ```
//!
//! recomputed whenever a vGPU becomes active or idle. Over the active set
//! the effective weights of a tenant add up to the tenant's weight, so
//! tenants share the GPU by their weights, and a tenant's idle VM leaves its
//! part to its siblings first (start-tag fair queuing gives each runnable
//! vGPU its weight's share of the GPU). A vGPU whose tenant has no weight of
//! its own keeps its weight as it is (a flat share, as without tenants).
//!
//! For an idle vGPU the effective weight is what it would get on becoming
//! active beside the active vGPUs of its tenant.

/// One vGPU as the split sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Member<'a> {
    /// Its tenant.
    pub tenant: &'a str,
    /// Its weight (within the tenant, if the tenant has a weight).
    pub weight: f64,
    /// The tenant's weight, if the operator gave it one.
    pub tenant_weight: Option<f64>,
    /// Whether it uses, wants or holds the GPU now.
    pub active: bool,
}

/// The effective weight of each member, in order.
pub fn effective_weights(members: &[Member<'_>]) -> Vec<f64> {
    members
        .iter()
        .map(|m| match m.tenant_weight {
            None => m.weight,
            Some(tw) => {
                let siblings: f64 = members
                    .iter()
                    .filter(|o| o.tenant == m.tenant && o.active)
                    .map(|o| o.weight)
                    .sum();
                let pool = if m.active {
                    siblings
                } else {
                    siblings + m.weight
                };
                if pool > 0.0 {
                    tw * m.weight / pool
                } else {
                    tw
                }
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(tenant: &str, weight: f64, tw: Option<f64>, active: bool) -> Member<'_> {
        Member {
            tenant,
            weight,
            tenant_weight: tw,
            active,
        }
    }

    #[test]
    fn a_tenant_weight_is_split_among_its_active_vms() {
        // acme (weight 2) has two VMs 1:3; solo (weight 2) one VM.
        let all = [
            m("acme", 1.0, Some(2.0), true),
            m("acme", 3.0, Some(2.0), true),
            m("solo", 5.0, Some(2.0), true),
        ];
        assert_eq!(effective_weights(&all), vec![0.5, 1.5, 2.0]);
        // acme's second VM idles: the first gets all of acme's weight.
        let idle = [
            m("acme", 1.0, Some(2.0), true),
            m("acme", 3.0, Some(2.0), false),
            m("solo", 5.0, Some(2.0), true),
        ];
        let w = effective_weights(&idle);
        assert_eq!(w[0], 2.0);
        assert_eq!(w[2], 2.0);
        assert_eq!(w[1], 1.5, "what it gets on waking beside its sibling");
    }

    #[test]
    fn vms_of_tenants_without_a_weight_keep_their_own() {
        let all = [
            m("flat", 1.0, None, true),
            m("flat", 3.0, None, false),
            m("acme", 7.0, Some(4.0), true),
        ];
        assert_eq!(effective_weights(&all), vec![1.0, 3.0, 4.0]);
    }

    #[test]
    fn active_effective_weights_of_a_tenant_add_up_to_its_weight() {
        let mut seed = 7u64;
        for _ in 0..500 {
            let mut v = Vec::new();
            for i in 0..8 {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let tenant = ["a", "b", "c"][i % 3];
                let weight = 0.1 + (seed >> 40) as f64 / (1u64 << 24) as f64 * 10.0;
                let active = (seed >> 20) & 1 == 1;
                v.push(m(tenant, weight, Some(1.0 + (i % 3) as f64), active));
            }
            let w = effective_weights(&v);
            for t in ["a", "b", "c"] {
                let (sum, any): (f64, bool) = v
                    .iter()
                    .zip(&w)
                    .filter(|(m, _)| m.tenant == t && m.active)
                    .fold((0.0, false), |(s, _), (_, w)| (s + w, true));
                if any {
                    let tw = v
                        .iter()
                        .find(|m| m.tenant == t)
                        .unwrap()
                        .tenant_weight
                        .unwrap();
                    assert!((sum - tw).abs() < 1e-9, "{t}: {sum} vs {tw}");
                }
            }
        }
    }
}
