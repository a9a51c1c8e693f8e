//! A libvirt domain's vGPU in its XML: the `<fairvgpu:vgpu>` element in the
//! domain's `<metadata>` (what the vGPU is) and the `<shmem>` device (how
//! QEMU reaches it). `fairvgpu libvirt-xml` adds both to a domain's XML;
//! `fairvgpu-libvirt` reads the element back in libvirt's hook and events.
//!
//! ```xml
//! <metadata>
//!   <fairvgpu:vgpu xmlns:fairvgpu="https://fairvgpu.dev/xmlns/vgpu/1"
//!                  tenant="acme" weight="2" memory_limit_mib="4096" gpu="0"/>
//! </metadata>
//! ```
//!
//! `weight` (default 1) and `gpu` (default: the daemon places it) may be
//! left out; the vGPU's name is the domain's.

use crate::declaration::VgpuDeclaration;

/// fairvgpu's XML namespace in libvirt domain metadata.
pub const NAMESPACE: &str = "https://fairvgpu.dev/xmlns/vgpu/1";
/// The prefix `fairvgpu libvirt-xml` writes (libvirt keeps its own).
pub const PREFIX: &str = "fairvgpu";
/// Who declares the vGPUs of libvirt's domains (status `declared_by`).
pub const OWNER: &str = "libvirt";

/// Why a domain's XML or its vGPU element was refused; the text names the
/// attribute at fault.
#[derive(Debug, thiserror::Error)]
pub enum XmlError {
    /// Not XML.
    #[error("the domain XML: {0}")]
    Parse(#[from] roxmltree::Error),
    /// The root is not `<domain>`.
    #[error("the domain XML has no <domain> root")]
    NotDomain,
    /// The domain has no `<name>`, or one that cannot name a vGPU.
    #[error("domain name {0:?}: a vGPU's name uses letters, digits, '-' and '_'")]
    Name(String),
    /// An attribute of the vGPU element is missing or malformed.
    #[error("fairvgpu metadata: {attr} {why}")]
    Attr {
        /// The attribute.
        attr: &'static str,
        /// What is wrong with it.
        why: String,
    },
    /// The domain has a vGPU element already (`libvirt-xml` adds one).
    #[error("the domain has fairvgpu metadata already")]
    Already,
}

/// A domain's vGPU, as its XML declares it.
#[derive(Debug, Clone, PartialEq)]
pub struct DomainVgpu {
    /// The domain's name, the vGPU's.
    pub name: String,
    /// The declaration to send to the daemon.
    pub declaration: VgpuDeclaration,
}

fn vgpu_element<'a>(root: roxmltree::Node<'a, 'a>) -> Option<roxmltree::Node<'a, 'a>> {
    let is_vgpu = |n: &roxmltree::Node| {
        n.is_element()
            && n.tag_name().name() == "vgpu"
            && n.tag_name().namespace() == Some(NAMESPACE)
    };
    if is_vgpu(&root) {
        return Some(root);
    }
    root.children()
        .find(|n| n.has_tag_name("metadata"))?
        .children()
        .find(is_vgpu)
}

/// The vGPU element's declaration: its attributes checked and parsed.
fn declaration(el: roxmltree::Node) -> Result<VgpuDeclaration, XmlError> {
    let bad = |attr: &'static str, why: String| XmlError::Attr { attr, why };
    for a in el.attributes() {
        if !matches!(a.name(), "tenant" | "weight" | "memory_limit_mib" | "gpu") {
            return Err(bad(
                "attributes",
                format!(
                    "has an unknown one, {:?} (known: tenant, weight, memory_limit_mib, gpu)",
                    a.name()
                ),
            ));
        }
    }
    let tenant = el
        .attribute("tenant")
        .ok_or_else(|| bad("tenant", "is missing".into()))?;
    let weight = match el.attribute("weight") {
        None => 1.0,
        Some(w) => match w.trim().parse::<f64>() {
            Ok(x) if x.is_finite() && x > 0.0 => x,
            _ => {
                return Err(bad(
                    "weight",
                    format!("must be a positive number, not {w:?}"),
                ))
            }
        },
    };
    let mib = el
        .attribute("memory_limit_mib")
        .ok_or_else(|| bad("memory_limit_mib", "is missing".into()))?;
    let memory_limit_mib = mib
        .trim()
        .parse::<u64>()
        .ok()
        .filter(|m| *m > 0)
        .ok_or_else(|| {
            bad(
                "memory_limit_mib",
                format!("must be a positive whole number of MiB, not {mib:?}"),
            )
        })?;
    let gpu = match el.attribute("gpu") {
        None => None,
        Some(g) => Some(
            g.trim()
                .parse::<u32>()
                .map_err(|_| bad("gpu", format!("must be a GPU index, not {g:?}")))?,
        ),
    };
    Ok(VgpuDeclaration {
        tenant: tenant.to_owned(),
        weight,
        memory_limit_mib,
        gpu,
        owner: Some(OWNER.into()),
    })
}

/// The name of the domain whose XML is `xml`, checked to name a vGPU.
pub fn domain_name(xml: &str) -> Result<String, XmlError> {
    let doc = roxmltree::Document::parse(xml)?;
    let root = doc.root_element();
    if !root.has_tag_name("domain") {
        return Err(XmlError::NotDomain);
    }
    name_of(root)
}

fn name_of(root: roxmltree::Node) -> Result<String, XmlError> {
    let name = root
        .children()
        .find(|n| n.has_tag_name("name"))
        .and_then(|n| n.text())
        .unwrap_or("")
        .to_owned();
    if name.is_empty()
        || name.len() > 64
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(XmlError::Name(name));
    }
    Ok(name)
}

/// The vGPU a domain's XML declares (`None`: it has no fairvgpu metadata).
pub fn domain_vgpu(xml: &str) -> Result<Option<DomainVgpu>, XmlError> {
    let doc = roxmltree::Document::parse(xml)?;
    let root = doc.root_element();
    if !root.has_tag_name("domain") {
        return Err(XmlError::NotDomain);
    }
    let Some(el) = vgpu_element(root) else {
        return Ok(None);
    };
    let name = name_of(root)?;
    Ok(Some(DomainVgpu {
        name,
        declaration: declaration(el)?,
    }))
}

/// The declaration of a bare vGPU element, as `virsh metadata` (and
/// `virDomainGetMetadata`, which asks by namespace and answers without
/// it) give it.
pub fn element_declaration(xml: &str) -> Result<VgpuDeclaration, XmlError> {
    let doc = roxmltree::Document::parse(xml)?;
    let root = doc.root_element();
    let bare = root.tag_name().name() == "vgpu" && root.tag_name().namespace().is_none();
    match vgpu_element(root).or(bare.then_some(root)) {
        Some(el) => declaration(el),
        None => Err(XmlError::Attr {
            attr: "element",
            why: format!("is not a <vgpu> of {NAMESPACE}"),
        }),
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&apos;")
}

/// The vGPU element for `d` (namespace declared on it).
pub fn vgpu_element_xml(d: &VgpuDeclaration) -> String {
    let mut s = format!(
        "<{PREFIX}:vgpu xmlns:{PREFIX}=\"{NAMESPACE}\" tenant=\"{}\" weight=\"{}\" memory_limit_mib=\"{}\"",
        escape(&d.tenant),
        d.weight,
        d.memory_limit_mib
    );
    if let Some(g) = d.gpu {
        s += &format!(" gpu=\"{g}\"");
    }
    s + "/>"
}

/// The user alias of the vGPU's `<shmem>` device in a domain.
pub const SHMEM_ALIAS: &str = "ua-fairvgpu";

/// libvirt's namespace of QEMU-specific domain elements.
pub const QEMU_NAMESPACE: &str = "http://libvirt.org/schemas/domain/qemu/1.0";

/// What makes the vGPU's device migratable: libvirt passes `master=on`
/// only to an `ivshmem-plain` device, and QEMU copies the region of, and
/// migrates, only a master `ivshmem-doorbell` (`virsh save`, `managedsave`,
/// `migrate`). libvirt 8.2 and later take the override, and mark the domain
/// tainted by it.
pub fn master_override() -> String {
    format!(
        "<qemu:override xmlns:qemu=\"{QEMU_NAMESPACE}\">\n    <qemu:device alias=\"{SHMEM_ALIAS}\">\n      <qemu:frontend>\n        <qemu:property name=\"master\" type=\"string\" value=\"on\"/>\n      </qemu:frontend>\n    </qemu:device>\n  </qemu:override>"
    )
}

/// `xml` with the vGPU element `d` in its `<metadata>`, `shmem` (the
/// `<shmem>` element of `fairvgpu attach --print libvirt`) in its
/// `<devices>`, each made where missing, and the [`master_override`]; the
/// rest of the text as it was.
pub fn add_vgpu(xml: &str, d: &VgpuDeclaration, shmem: &str) -> Result<String, XmlError> {
    let doc = roxmltree::Document::parse(xml)?;
    let root = doc.root_element();
    if !root.has_tag_name("domain") {
        return Err(XmlError::NotDomain);
    }
    if vgpu_element(root).is_some() {
        return Err(XmlError::Already);
    }
    let el = vgpu_element_xml(d);
    let shmem = shmem.trim_end().replace('\n', "\n    ");
    // Replacements of byte ranges (an insertion: an empty one), applied
    // from the last.
    let mut edits: Vec<(std::ops::Range<usize>, String)> = Vec::new();
    // Where `n`'s closing tag starts (`None`: an empty element, `<x/>`).
    let closing = |n: roxmltree::Node| -> Option<usize> {
        let r = n.range();
        let text = &xml[r.clone()];
        (!text.ends_with("/>")).then(|| text.rfind("</").map(|i| r.start + i))?
    };
    let end_of_domain = closing(root).ok_or(XmlError::NotDomain)?;
    for (tag, inner) in [("metadata", &el), ("devices", &shmem)] {
        match root.children().find(|n| n.has_tag_name(tag)) {
            Some(n) => match closing(n) {
                Some(at) => edits.push((at..at, format!("  {inner}\n  "))),
                None => edits.push((n.range(), format!("<{tag}>\n    {inner}\n  </{tag}>"))),
            },
            None => edits.push((
                end_of_domain..end_of_domain,
                format!("  <{tag}>\n    {inner}\n  </{tag}>\n"),
            )),
        }
    }
    edits.push((
        end_of_domain..end_of_domain,
        format!("  {}\n", master_override()),
    ));
    edits.sort_by_key(|e| std::cmp::Reverse(e.0.start));
    let mut out = xml.to_owned();
    for (range, text) in edits {
        out.replace_range(range, &text);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOMAIN: &str = "<domain type='qemu'>\n  <name>dom-1</name>\n  <memory unit='MiB'>512</memory>\n  <devices>\n    <emulator>/usr/bin/qemu-system-x86_64</emulator>\n  </devices>\n</domain>\n";
    const SHMEM: &str =
        "<shmem name='fairvgpu-dom-1'>\n  <model type='ivshmem-doorbell'/>\n</shmem>\n";

    fn decl() -> VgpuDeclaration {
        VgpuDeclaration {
            tenant: "acme".into(),
            weight: 2.0,
            memory_limit_mib: 256,
            gpu: Some(1),
            owner: Some(OWNER.into()),
        }
    }

    #[test]
    fn added_vgpu_reads_back_and_the_rest_is_kept() {
        let out = add_vgpu(DOMAIN, &decl(), SHMEM).unwrap();
        let v = domain_vgpu(&out).unwrap().unwrap();
        assert_eq!(v.name, "dom-1");
        assert_eq!(v.declaration, decl());
        assert!(
            out.contains("<emulator>/usr/bin/qemu-system-x86_64</emulator>"),
            "{out}"
        );
        let doc = roxmltree::Document::parse(&out).unwrap();
        let shmem = doc.descendants().find(|n| n.has_tag_name("shmem")).unwrap();
        assert_eq!(shmem.parent_element().unwrap().tag_name().name(), "devices");
        // The device's override, in libvirt's QEMU namespace, for it.
        let prop = doc
            .descendants()
            .find(|n| n.has_tag_name((QEMU_NAMESPACE, "property")))
            .unwrap();
        assert_eq!(
            (prop.attribute("name"), prop.attribute("value")),
            (Some("master"), Some("on"))
        );
        let dev = prop
            .ancestors()
            .find(|n| n.has_tag_name((QEMU_NAMESPACE, "device")))
            .unwrap();
        assert_eq!(dev.attribute("alias"), Some(SHMEM_ALIAS));
        assert_eq!(
            dev.parent_element().unwrap().parent_element(),
            Some(doc.root_element())
        );
        // Twice is refused, not a second element.
        assert!(matches!(
            add_vgpu(&out, &decl(), SHMEM),
            Err(XmlError::Already)
        ));
        // Into an existing (or empty) <metadata> and an empty <devices/>.
        let other =
            "<domain><name>d</name><metadata><x:y xmlns:x='urn:x'/></metadata><devices/></domain>";
        let out = add_vgpu(other, &decl(), SHMEM).unwrap();
        assert!(out.contains("<x:y xmlns:x='urn:x'/>"), "{out}");
        assert_eq!(domain_vgpu(&out).unwrap().unwrap().declaration, decl());
        let empty = "<domain><name>d</name><metadata/></domain>";
        let out = add_vgpu(empty, &decl(), SHMEM).unwrap();
        assert_eq!(domain_vgpu(&out).unwrap().unwrap().name, "d");
    }

    #[test]
    fn a_domain_without_metadata_has_no_vgpu() {
        assert_eq!(domain_vgpu(DOMAIN).unwrap(), None);
        assert!(matches!(
            domain_vgpu("<network/>"),
            Err(XmlError::NotDomain)
        ));
        assert!(matches!(domain_vgpu("<domain"), Err(XmlError::Parse(_))));
    }

    #[test]
    fn each_bad_attribute_is_named() {
        let el = |attrs: &str| {
            format!("<domain><name>d</name><metadata><v:vgpu xmlns:v='{NAMESPACE}' {attrs}/></metadata></domain>")
        };
        for (attrs, named) in [
            ("memory_limit_mib='64'", "tenant"),
            ("tenant='a' weight='0' memory_limit_mib='64'", "weight"),
            ("tenant='a' weight='-2' memory_limit_mib='64'", "weight"),
            ("tenant='a' weight='nan' memory_limit_mib='64'", "weight"),
            ("tenant='a' weight='inf' memory_limit_mib='64'", "weight"),
            ("tenant='a'", "memory_limit_mib"),
            ("tenant='a' memory_limit_mib='0'", "memory_limit_mib"),
            ("tenant='a' memory_limit_mib='1G'", "memory_limit_mib"),
            ("tenant='a' memory_limit_mib='64' gpu='-1'", "gpu"),
            ("tenant='a' memory_limit_mib='64' colour='red'", "colour"),
        ] {
            let e = domain_vgpu(&el(attrs)).unwrap_err().to_string();
            assert!(e.contains(named), "{attrs}: {e}");
        }
        // Another namespace's <vgpu> is not ours.
        let theirs = "<domain><name>d</name><metadata><vgpu xmlns='urn:other' tenant='a'/></metadata></domain>";
        assert_eq!(domain_vgpu(theirs).unwrap(), None);
        let e = domain_vgpu(
            &el("tenant='a' memory_limit_mib='64'").replace("<name>d</name>", "<name>a b</name>"),
        );
        assert!(matches!(e, Err(XmlError::Name(_))), "{e:?}");
    }

    #[test]
    fn a_bare_element_as_virsh_metadata_gives_it() {
        let d = element_declaration(&vgpu_element_xml(&decl())).unwrap();
        assert_eq!(d, decl());
        let plain = format!("<vgpu xmlns='{NAMESPACE}' tenant='t' memory_limit_mib='8'/>");
        assert_eq!(element_declaration(&plain).unwrap().weight, 1.0);
        // As libvirt answers a metadata query: without the namespace.
        let bare = "<vgpu tenant='t' weight='3' memory_limit_mib='8'/>";
        assert_eq!(element_declaration(bare).unwrap().weight, 3.0);
        assert!(
            element_declaration("<vgpu xmlns='urn:other' tenant='t' memory_limit_mib='8'/>")
                .is_err()
        );
        assert!(element_declaration("<other/>").is_err());
    }
}
