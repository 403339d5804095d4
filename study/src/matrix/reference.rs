//! Container image references, checked against Docker's grammar
//! (distribution's `reference` package) before a matrix is accepted:
//!
//! ```text
//! reference  := name [ ":" tag ] [ "@" digest ]
//! name       := [ domain "/" ] component ( "/" component )*
//! domain     := host [ ":" port ]          host: DNS labels or [IPv6]
//! component  := [a-z0-9]+ ( ( "." | "_" | "__" | "-"+ ) [a-z0-9]+ )*
//! tag        := [A-Za-z0-9_] [A-Za-z0-9_.-]{0,127}
//! digest     := algorithm ":" hex          hex: 32 or more of [0-9a-fA-F]
//! ```
//!
//! The first part of a name is a domain when it holds a `.` or a `:`, is
//! `localhost`, or has an upper-case letter; a name is at most 255
//! characters.

/// Why `image` is not an image reference, if it is not.
pub fn check(image: &str) -> Result<(), String> {
    if image.is_empty() {
        return Err("is empty".to_owned());
    }
    let (rest, digest) = match image.split_once('@') {
        Some((rest, digest)) => (rest, Some(digest)),
        None => (image, None),
    };
    if let Some(digest) = digest {
        check_digest(digest)?;
    }
    let (name, tag) = match rest.rfind(':') {
        Some(i) if !rest[i..].contains('/') => (&rest[..i], Some(&rest[i + 1..])),
        _ => (rest, None),
    };
    if let Some(tag) = tag {
        check_tag(tag)?;
    }
    if name.is_empty() {
        return Err("has no repository name".to_owned());
    }
    if name.len() > 255 {
        return Err(format!("has a name of {} characters; at most 255", name.len()));
    }
    let mut parts: Vec<&str> = name.split('/').collect();
    let first = parts[0];
    if parts.len() > 1
        && (first.contains(['.', ':']) || first == "localhost" || first.chars().any(|c| c.is_ascii_uppercase()))
    {
        check_domain(first)?;
        parts.remove(0);
    }
    parts.iter().try_for_each(|p| check_component(p))
}

fn check_component(part: &str) -> Result<(), String> {
    let bad = || {
        Err(format!(
            "has the path component '{part}'; components are lower-case letters and digits, \
             joined by '.', '_', '__' or dashes"
        ))
    };
    let b = part.as_bytes();
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    if b.is_empty() || !alnum(b[0]) || !alnum(b[b.len() - 1]) {
        return bad();
    }
    let mut i = 0;
    while i < b.len() {
        if alnum(b[i]) {
            i += 1;
            continue;
        }
        // A separator: ".", "_", "__" or a run of dashes, between alphanumerics.
        let start = i;
        while i < b.len() && !alnum(b[i]) {
            i += 1;
        }
        let sep = &part[start..i];
        if !(sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|c| c == b'-')) {
            return bad();
        }
    }
    Ok(())
}

fn check_domain(domain: &str) -> Result<(), String> {
    let bad = |why: &str| Err(format!("has the registry '{domain}', which {why}"));
    let (host, port) = if let Some(v6) = domain.strip_prefix('[') {
        match v6.split_once(']') {
            Some((addr, rest)) if addr.parse::<std::net::Ipv6Addr>().is_ok() => {
                (None, if rest.is_empty() { None } else { rest.strip_prefix(':').or(Some("")) })
            }
            _ => return bad("is not a bracketed IPv6 address"),
        }
    } else {
        match domain.split_once(':') {
            Some((host, port)) => (Some(host), Some(port)),
            None => (Some(domain), None),
        }
    };
    if let Some(port) = port
        && (port.is_empty() || !port.bytes().all(|c| c.is_ascii_digit()))
    {
        return bad("has a port that is not a number");
    }
    if let Some(host) = host {
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        };
        if !host.split('.').all(label_ok) {
            return bad("is not a host name (letters, digits and inner dashes, joined by dots)");
        }
    }
    Ok(())
}

fn check_tag(tag: &str) -> Result<(), String> {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let ok = tag.len() <= 128
        && tag.chars().next().is_some_and(word)
        && tag.chars().all(|c| word(c) || c == '.' || c == '-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "has the tag '{tag}'; a tag is up to 128 letters, digits, '_', '.' and '-', not beginning with '.' or '-'"
        ))
    }
}

fn check_digest(digest: &str) -> Result<(), String> {
    let bad = || Err(format!("has the digest '{digest}'; a digest is algorithm:hex, e.g. sha256: and 64 hex digits"));
    let Some((algorithm, hex)) = digest.split_once(':') else { return bad() };
    let algorithm_ok = algorithm.split(['+', '.', '-', '_']).all(|c| {
        c.chars().next().is_some_and(|f| f.is_ascii_alphabetic()) && c.chars().all(|x| x.is_ascii_alphanumeric())
    });
    if !algorithm_ok || hex.len() < 32 || !hex.bytes().all(|c| c.is_ascii_hexdigit()) {
        return bad();
    }
    if algorithm == "sha256" && hex.len() != 64 {
        return Err(format!("has the digest '{digest}'; a sha256 digest has 64 hex digits, this one {}", hex.len()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check;

    #[test]
    fn docker_references() {
        let sha = "sha256:".to_owned() + &"a".repeat(64);
        for good in [
            "vllm/vllm-openai:v0.17.1",
            "lmsysorg/sglang:v0.5.9",
            "ubuntu",
            "nvcr.io/nvidia/tritonserver:24.05-py3",
            "localhost:5000/benchfleet-sim:latest",
            "localhost/sim",
            "[::1]:5000/a/b",
            "my-registry.example:443/team/image__x.y-z---w",
            &format!("vllm/vllm-openai@{sha}"),
            &format!("vllm/vllm-openai:v1@{sha}"),
        ] {
            assert_eq!(check(good), Ok(()), "{good}");
        }
        for (bad, why) in [
            ("", "is empty"),
            ("VLLM", "path component 'VLLM'"),
            ("vllm/VLLM", "path component 'VLLM'"),
            ("vllm/vllm-openai:", "tag ''"),
            ("vllm/vllm-openai:.x", "tag '.x'"),
            ("vllm//x", "path component ''"),
            ("vllm/x_", "path component 'x_'"),
            ("vllm/a___b", "path component 'a___b'"),
            ("-x/y", "path component '-x'"),
            ("bad_host.example/y", "registry 'bad_host.example'"),
            ("host:port/x", "port"),
            ("vllm/x@sha256:abc", "digest"),
            ("vllm/x@md5:", "digest"),
            ("vllm/x y", "path component 'x y'"),
            (":tag", "no repository name"),
        ] {
            let e = check(bad).expect_err(bad);
            assert!(e.contains(why), "{bad}: {e}");
        }
        assert!(check(&format!("{}/x", "a".repeat(255))).expect_err("refused").contains("at most 255"));
    }
}
