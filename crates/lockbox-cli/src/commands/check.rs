//! `lockbox check`: kernel features, what lockbox uses, and (`--explain`) the setup plan.

use super::print_error;
use crate::cli::CheckArgs;
use crate::error::CliError;
use crate::error::ExitCode;
use crate::output::outln;

pub fn run(args: &CheckArgs) -> Result<ExitCode, CliError> {
    let mut support = lockbox_confine::probe();
    let mut policy = args
        .policy
        .to_policy()
        .map_err(|e| CliError::usage(super::chain(&e)))?;
    // An --image is explained on its root as it is in the store (nothing is pulled here).
    let image = match policy.image.clone() {
        Some(reference) => Some(image_root(&mut policy, reference, &args.state)?),
        None => None,
    };
    let explain = || match &image {
        Some(root) => lockbox_confine::explain_image(&policy, root),
        None => lockbox_confine::explain(&policy),
    };
    // A real sandbox start is the only honest test of the whole stack (on the host's
    // userland: what the kernel allows does not depend on the image).
    let plain = lockbox_policy::Policy {
        image: None,
        ..policy.clone()
    };
    let smoke = lockbox_confine::run(&plain, &["true".into()]);
    let smoke_line = match &smoke {
        Ok(o) if o.exit_code() == 0 => "ok: a sandbox started and ran `true`".to_owned(),
        Ok(o) => format!("failed: `true` exited with {}", o.exit_code()),
        Err(e) => format!("failed: {e}"),
    };
    let mechanisms = smoke.as_ref().ok().map(|o| &o.enforcement);
    // The default policy mounts /etc through an overlay, so a started sandbox proves it.
    let smoke_ok = smoke.as_ref().is_ok_and(|o| o.exit_code() == 0);
    support.features.push(lockbox_confine::Feature {
        name: "overlayfs in user namespaces",
        available: smoke_ok && policy.fs.default_reads,
        detail: if policy.fs.default_reads {
            "tested by starting a sandbox".into()
        } else {
            "not tested (--no-default-reads)".into()
        },
        used_for: "the default /etc view without secrets; copy-on-write workspaces",
    });
    if args.json {
        let plan = if args.explain {
            explain().ok().map(|p| p.to_string())
        } else {
            None
        };
        let json = serde_json::json!({
            "kernel": support.kernel,
            "uid": support.uid,
            "features": support.features,
            "sandbox": { "ok": smoke.as_ref().is_ok_and(|o| o.exit_code() == 0), "detail": smoke_line },
            "enforcement": mechanisms,
            "plan": plan,
        });
        outln!("{}", crate::output::json(&json, true));
    } else {
        outln!("kernel {} (uid {})", support.kernel, support.uid);
        for f in &support.features {
            let mark = if f.available { "yes" } else { "no " };
            let detail = if f.detail.is_empty() {
                String::new()
            } else {
                format!(" ({})", f.detail)
            };
            outln!("  [{mark}] {}{detail}\n        {}", f.name, f.used_for);
        }
        outln!("sandbox: {smoke_line}");
        if let Some(e) = mechanisms {
            outln!("  namespaces: {}", e.namespaces.join(", "));
            match e.landlock_abi {
                Some(abi) => outln!("  landlock: ABI {abi}, enforced"),
                None => outln!("  landlock: not available"),
            }
            outln!(
                "  seccomp: {} syscall rules deny",
                e.seccomp_denied_syscalls
            );
            outln!("  network: {}", e.network);
        }
        if args.explain {
            match explain() {
                Ok(plan) => outln!("\nsetup plan:\n{plan}"),
                Err(e) => print_error(&e, e.hint()),
            }
        }
    }
    match smoke {
        Ok(o) if o.exit_code() == 0 => Ok(ExitCode::SUCCESS),
        // The report above says why; a script reads the code.
        _ => Err(CliError::reported(125)),
    }
}

/// The root of image `reference` from the store, its config applied to `policy`.
fn image_root(
    policy: &mut lockbox_policy::Policy,
    reference: String,
    state: &crate::cli::StateArgs,
) -> Result<lockbox_confine::ImageRoot, CliError> {
    let state_dir = state
        .resolve()
        .map_err(|e| CliError::usage(super::chain(&e)))?;
    let store = lockbox_image::Store::in_state_dir(&state_dir)?;
    let image = store.get(&reference)?.ok_or_else(|| {
        CliError::new(2, format!("image {reference:?} is not in the store")).hint(format!(
            "check does not pull: `lockbox image pull {reference}` first"
        ))
    })?;
    let (root, _) = lockbox_image::apply(&image, policy, &["true".into()])?;
    Ok(root)
}
