//! TOML profiles (`lockbox run --profile FILE`): parsing never panics, and a profile that
//! parses survives a round trip through its own serialisation unchanged.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lockbox_policy::Policy;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(policy) = Policy::from_toml(text) else {
        return;
    };
    let again = toml::to_string(&policy).expect("a parsed policy serialises");
    let reparsed = Policy::from_toml(&again).expect("a serialised policy parses");
    assert_eq!(policy, reparsed, "round trip changed the policy:\n{again}");
});
