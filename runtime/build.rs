//! The built-in host profile (`rootfs/host.toml`) as JSON in
//! `OUT_DIR/host-profile.json`: `Profile::host` reads that at every run,
//! which costs a fraction of parsing the TOML (ADR 0406). The test
//! `profile::tests::the_built_in_profile_reads_the_same_from_json_and_toml`
//! holds the two to the same profile.

fn main() {
    println!("cargo::rerun-if-changed=../rootfs/host.toml");
    let text = match std::fs::read_to_string("../rootfs/host.toml") {
        Ok(t) => t,
        Err(e) => fail(&format!("reading rootfs/host.toml: {e}")),
    };
    let value: toml::Value = match toml::from_str(&text) {
        Ok(v) => v,
        Err(e) => fail(&format!("rootfs/host.toml: {e}")),
    };
    let json = match serde_json::to_string(&value) {
        Ok(j) => j,
        Err(e) => fail(&format!("rootfs/host.toml as JSON: {e}")),
    };
    let Some(out) = std::env::var_os("OUT_DIR").map(std::path::PathBuf::from) else {
        fail("OUT_DIR is not set");
    };
    if let Err(e) = std::fs::write(out.join("host-profile.json"), json) {
        fail(&format!(
            "writing the host profile to {}: {e}",
            out.display()
        ));
    }
}

fn fail(why: &str) -> ! {
    eprintln!("retie-runtime build: {why}");
    std::process::exit(1)
}
