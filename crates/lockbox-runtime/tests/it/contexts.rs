//! Code contexts: persistent Python and bash interpreters in a sandbox, on the real kernel
//! (the sandbox's `python3` is the system's).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::{also_as_nobody, sandbox, scratch};
use futures_util::StreamExt;
use lockbox_runtime::{CodeEvent, ContextOptions, Execution, Language, RunCodeRequest, Sandbox};
use std::time::{Duration, Instant};

fn code(c: &str, context: Option<&str>) -> RunCodeRequest {
    RunCodeRequest {
        code: c.into(),
        context: context.map(Into::into),
        timeout: None,
        env: Vec::new(),
    }
}

async fn run(sb: &Sandbox, c: &str) -> Execution {
    sb.run_code(code(c, None)).await.unwrap()
}

fn text(e: &Execution) -> Option<String> {
    e.results
        .iter()
        .find(|r| r.is_main_result)
        .and_then(|r| r.data.get("text/plain"))
        .and_then(|v| v.as_str())
        .map(str::to_owned)
}

/// Makes context `id` of `language` in `sb`, with `env` as its variables.
async fn new_context(sb: &Sandbox, id: &str, language: Language, env: &[(&str, &str)]) {
    let opts = ContextOptions {
        id: Some(id.into()),
        language,
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..ContextOptions::default()
    };
    assert_eq!(sb.create_context(opts).await.unwrap().language, language);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_context_keeps_its_variables_across_100_runs() {
    also_as_nobody(&lockbox_testkit::test_name!(
        "a_python_context_keeps_its_variables_across_100_runs"
    ));
    let state = scratch();
    let (_rt, sb) = sandbox(state.path()).await;
    let first = run(&sb, "n = 0\nn").await;
    assert_eq!(text(&first).as_deref(), Some("0"), "{first:?}");
    for i in 1..=100 {
        let e = run(&sb, "n += 1\nn").await;
        assert!(e.error.is_none(), "{e:?}");
        assert_eq!(text(&e), Some(i.to_string()));
    }
    let e = run(&sb, "print('done', n)").await;
    assert_eq!(e.logs.stdout.concat(), "done 100\n");
    assert!(e.results.is_empty(), "print returns None: no result");
    let list = sb.list_contexts().await;
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].id, "default");
    assert_eq!(list[0].runs, 102);
    assert_eq!(list[0].restarts, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exception_comes_back_with_name_value_and_traceback() {
    also_as_nobody(&lockbox_testkit::test_name!(
        "an_exception_comes_back_with_name_value_and_traceback"
    ));
    let state = scratch();
    let (_rt, sb) = sandbox(state.path()).await;
    run(&sb, "def check(x):\n    raise ValueError(f'bad {x}')").await;
    let e = run(&sb, "print('before')\ncheck(7)").await;
    let err = e.error.expect("an error");
    assert_eq!(err.name, "ValueError");
    assert_eq!(err.value, "bad 7");
    assert!(
        err.traceback.contains("raise ValueError"),
        "{}",
        err.traceback
    );
    assert!(err.traceback.contains("in check"), "{}", err.traceback);
    assert!(
        !err.traceback.contains("<string>"),
        "runner frames left out: {}",
        err.traceback
    );
    assert_eq!(e.logs.stdout.concat(), "before\n");
    let syntax = run(&sb, "def (").await.error.unwrap();
    assert_eq!(syntax.name, "SyntaxError");
}

/// IPython's shell escapes, as E2B's interpreter users write them (`!pip install ...`):
/// a line starting with `!` runs in the shell, between the Python lines around it; valid
/// Python (a `!` line inside a string) is left alone, and code that is not Python either
/// way reports its own syntax error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_line_starting_with_a_bang_runs_in_the_shell() {
    also_as_nobody(&lockbox_testkit::test_name!(
        "a_line_starting_with_a_bang_runs_in_the_shell"
    ));
    let state = scratch();
    let (_rt, sb) = sandbox(state.path()).await;
    let e = run(
        &sb,
        "print('py')\n!echo sh-$((1+1)); echo err >&2\nx = 5\nx",
    )
    .await;
    assert!(e.error.is_none(), "{e:?}");
    assert_eq!(e.logs.stdout.concat(), "py\nsh-2\n");
    assert_eq!(e.logs.stderr.concat(), "err\n");
    assert_eq!(text(&e).as_deref(), Some("5"));
    let e = run(&sb, "if True:\n    !exit 3\nx + 1").await;
    assert_eq!(text(&e).as_deref(), Some("6"), "{e:?}");
    let e = run(&sb, "s = \"\"\"\n!not a command\n\"\"\"\ns.strip()").await;
    assert_eq!(text(&e).as_deref(), Some("'!not a command'"), "{e:?}");
    let syntax = run(&sb, "!echo fine\ndef (").await.error.unwrap();
    assert_eq!(syntax.name, "SyntaxError");
    assert!(syntax.traceback.contains("line 2"), "{}", syntax.traceback);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rich_results_come_as_mime_bundles() {
    also_as_nobody(&lockbox_testkit::test_name!(
        "rich_results_come_as_mime_bundles"
    ));
    let state = scratch();
    let (_rt, sb) = sandbox(state.path()).await;
    let e = run(
        &sb,
        "class T:\n    def _repr_html_(self): return '<b>t</b>'\n    def _repr_json_(self): return {'a': 1}\n\
         display(T())\n{'k': [1, 2]}",
    )
    .await;
    assert_eq!(e.results.len(), 2, "{e:?}");
    assert!(!e.results[0].is_main_result);
    assert_eq!(e.results[0].data["text/html"], "<b>t</b>");
    assert_eq!(e.results[0].data["application/json"]["a"], 1);
    assert!(e.results[1].is_main_result);
    assert_eq!(e.results[1].data["text/plain"], "{'k': [1, 2]}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_infinite_loop_is_interrupted_at_its_timeout_and_the_context_survives() {
    also_as_nobody(&lockbox_testkit::test_name!(
        "an_infinite_loop_is_interrupted_at_its_timeout_and_the_context_survives"
    ));
    let state = scratch();
    let (_rt, sb) = sandbox(state.path()).await;
    run(&sb, "kept = 41").await;
    let started = Instant::now();
    let mut req = code("while True:\n    pass", None);
    req.timeout = Some(Duration::from_millis(300));
    let e = sb.run_code(req).await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert!(e.timed_out && !e.state_lost, "{e:?}");
    let err = e.error.unwrap();
    assert_eq!(err.name, "KeyboardInterrupt");
    assert!(err.value.contains("timeout"), "{}", err.value);
    let after = run(&sb, "kept + 1").await;
    assert_eq!(
        text(&after).as_deref(),
        Some("42"),
        "the context kept its state"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn code_that_ignores_sigint_is_killed_and_the_context_restarts_fresh() {
    also_as_nobody(&lockbox_testkit::test_name!(
        "code_that_ignores_sigint_is_killed_and_the_context_restarts_fresh"
    ));
    let state = scratch();
    let (_rt, sb) = sandbox(state.path()).await;
    run(&sb, "kept = 1").await;
    let mut req = code(
        "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: time.sleep(0.01)",
        None,
    );
    req.timeout = Some(Duration::from_millis(200));
    let e = sb.run_code(req).await.unwrap();
    assert!(e.timed_out && e.state_lost, "{e:?}");
    assert_eq!(e.error.as_ref().unwrap().name, "Timeout");
    assert!(e.error.unwrap().value.contains("state"));
    let after = run(&sb, "'kept' in globals()").await;
    assert_eq!(
        text(&after).as_deref(),
        Some("False"),
        "a fresh interpreter"
    );
    assert_eq!(sb.list_contexts().await[0].restarts, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashing_interpreter_is_reported_and_restarted_on_the_next_run() {
    also_as_nobody(&lockbox_testkit::test_name!(
        "a_crashing_interpreter_is_reported_and_restarted_on_the_next_run"
    ));
    let state = scratch();
    let (_rt, sb) = sandbox(state.path()).await;
    let e = run(&sb, "import os\nprint('bye', flush=True)\nos._exit(3)").await;
    assert!(e.state_lost, "{e:?}");
    let err = e.error.unwrap();
    assert_eq!(err.name, "InterpreterDied");
    assert!(err.value.contains("status 3"), "{}", err.value);
    assert_eq!(e.logs.stdout.concat(), "bye\n");
    let e = run(&sb, "import ctypes\nctypes.string_at(0)").await;
    assert!(e.state_lost);
    assert!(
        e.error.unwrap().value.contains("signal 11"),
        "a segfault names its signal"
    );
    let after = run(&sb, "6 * 7").await;
    assert_eq!(text(&after).as_deref(), Some("42"));
}

/// A client that gives up on a streamed run (drops its stream: an HTTP client's timeout)
/// does not leave the context busy until the run's own timeout: the run is interrupted
/// (SIGINT, as at a timeout), the interpreter and its variables stay, and the next run
/// starts at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_whose_reader_goes_away_is_interrupted_and_the_context_goes_on() {
    also_as_nobody(&lockbox_testkit::test_name!(
        "a_run_whose_reader_goes_away_is_interrupted_and_the_context_goes_on"
    ));
    let state = scratch();
    let (_rt, sb) = sandbox(state.path()).await;
    run(&sb, "import time\nkept = 41").await;
    let mut stream = sb
        .run_code_stream(code("print('sleeping')\ntime.sleep(300)", None))
        .await
        .unwrap();
    let first = stream.next().await;
    assert!(
        matches!(&first, Some(CodeEvent::Stdout { text }) if text == "sleeping\n"),
        "{first:?}"
    );
    drop(stream);
    let next = tokio::time::timeout(Duration::from_secs(60), run(&sb, "kept + 1"))
        .await
        .expect("the next run waited for the abandoned one");
    assert!(next.error.is_none(), "{next:?}");
    assert_eq!(text(&next).as_deref(), Some("42"), "{next:?}");
    assert!(!next.state_lost, "{next:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdout_is_streamed_before_the_run_ends() {
    also_as_nobody(&lockbox_testkit::test_name!(
        "stdout_is_streamed_before_the_run_ends"
    ));
    let state = scratch();
    let (_rt, sb) = sandbox(state.path()).await;
    run(&sb, "import time").await;
    let started = Instant::now();
    let mut stream = sb
        .run_code_stream(code(
            "print('first')\ntime.sleep(1.5)\nprint('second')\n'end'",
            None,
        ))
        .await
        .unwrap();
    let mut seen = Vec::new();
    while let Some(ev) = stream.next().await {
        seen.push((started.elapsed(), ev));
    }
    let (at, first) = &seen[0];
    assert!(
        matches!(first, CodeEvent::Stdout { text } if text == "first\n"),
        "{seen:?}"
    );
    assert!(*at < Duration::from_millis(1000), "first line after {at:?}");
    let Some((end_at, CodeEvent::End(exec))) = seen.last() else {
        panic!("{seen:?}")
    };
    assert!(*end_at >= Duration::from_millis(1500));
    assert_eq!(exec.logs.stdout.concat(), "first\nsecond\n");
    assert_eq!(text(exec).as_deref(), Some("'end'"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bash_context_keeps_its_cwd_and_variables() {
    also_as_nobody(&lockbox_testkit::test_name!(
        "a_bash_context_keeps_its_cwd_and_variables"
    ));
    let state = scratch();
    let (_rt, sb) = sandbox(state.path()).await;
    let info = sb
        .create_context(ContextOptions {
            id: Some("sh".into()),
            language: Language::Bash,
            ..ContextOptions::default()
        })
        .await
        .unwrap();
    assert_eq!(info.language, Language::Bash);
    let r = |c: &str| sb.run_code(code(c, Some("sh")));
    let e = r("cd /tmp && X=hello && f() { echo \"f:$1\"; }")
        .await
        .unwrap();
    assert!(e.error.is_none() && e.exit_code == Some(0), "{e:?}");
    let e = r("echo $X $PWD; f 1; echo oops >&2").await.unwrap();
    assert_eq!(e.logs.stdout.concat(), "hello /tmp\nf:1\n");
    assert_eq!(e.logs.stderr.concat(), "oops\n");
    let e = r("false").await.unwrap();
    assert_eq!(e.exit_code, Some(1));
    assert_eq!(e.error.unwrap().name, "ExitCode");
    let mut slow = code("sleep 100", Some("sh"));
    slow.timeout = Some(Duration::from_millis(300));
    let e = sb.run_code(slow).await.unwrap();
    assert!(e.timed_out && !e.state_lost, "{e:?}");
    assert_eq!(e.error.unwrap().name, "KeyboardInterrupt");
    let e = r("echo $X").await.unwrap();
    assert_eq!(
        e.logs.stdout.concat(),
        "hello\n",
        "the shell survived the interrupt"
    );
    sb.delete_context("sh").await.unwrap();
    let err = sb.run_code(code("true", Some("sh"))).await.unwrap_err();
    assert_eq!(err.code().as_str(), "CONTEXT_NOT_FOUND");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_context_keeps_its_bindings_and_is_interrupted_at_its_timeout() {
    lockbox_testkit::require!(
        std::path::Path::new("/usr/bin/node").exists(),
        "no /usr/bin/node"
    );
    also_as_nobody(&lockbox_testkit::test_name!(
        "a_node_context_keeps_its_bindings_and_is_interrupted_at_its_timeout"
    ));
    let state = scratch();
    let (_rt, sb) = sandbox(state.path()).await;
    new_context(&sb, "js", Language::Node, &[]).await;
    let r = |c: &str| sb.run_code(code(c, Some("js")));
    r("let n = 40; function add(a, b) { return a + b }")
        .await
        .unwrap();
    let e = r("console.log('hi'); add(n, 2)").await.unwrap();
    assert_eq!(text(&e).as_deref(), Some("42"), "{e:?}");
    assert_eq!(e.logs.stdout.concat(), "hi\n");
    let err = r("null.x").await.unwrap().error.unwrap();
    assert_eq!(err.name, "TypeError");
    assert!(err.traceback.contains("<cell 3>"), "{}", err.traceback);
    let mut spin = code("while (true) {}", Some("js"));
    spin.timeout = Some(Duration::from_millis(300));
    let e = sb.run_code(spin).await.unwrap();
    assert!(e.timed_out && !e.state_lost, "{e:?}");
    assert_eq!(e.error.unwrap().name, "KeyboardInterrupt");
    assert_eq!(text(&r("n").await.unwrap()).as_deref(), Some("40"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_context_awaits_at_the_top_level_and_imports_as_a_module_would() {
    lockbox_testkit::require!(
        std::path::Path::new("/usr/bin/node").exists(),
        "no /usr/bin/node"
    );
    also_as_nobody(&lockbox_testkit::test_name!(
        "a_node_context_awaits_at_the_top_level_and_imports_as_a_module_would"
    ));
    let state = scratch();
    let (_rt, sb) = sandbox(state.path()).await;
    new_context(&sb, "js", Language::Node, &[]).await;
    let r = |c: &str| sb.run_code(code(c, Some("js")));
    // The awaited value is the result, and what the run declared stays for the next one.
    let e = r("const greeting = await Promise.resolve('Hello World!')\ngreeting.length")
        .await
        .unwrap();
    assert_eq!(text(&e).as_deref(), Some("12"), "{e:?}");
    let e = r("await new Promise((ok) => setTimeout(() => ok(greeting + '!'), 20))")
        .await
        .unwrap();
    assert_eq!(text(&e).as_deref(), Some("'Hello World!!'"), "{e:?}");
    // A rejection is the run's error.
    let err = r("await Promise.reject(new RangeError('no'))")
        .await
        .unwrap()
        .error
        .unwrap();
    assert_eq!(
        (err.name.as_str(), err.value.as_str()),
        ("RangeError", "no")
    );
    // Static imports become requires.
    let e = r("import { readFileSync as read } from 'fs'\nimport * as path from 'path'\nimport util from 'util'\nconsole.log(typeof read, path.sep, typeof util.inspect)")
        .await
        .unwrap();
    assert!(e.error.is_none(), "{e:?}");
    assert_eq!(e.logs.stdout.concat(), "function / function\n");
    // An await that never ends is interrupted at the timeout; the context lives on.
    let mut hang = code("await new Promise(() => {})", Some("js"));
    hang.timeout = Some(Duration::from_millis(300));
    let e = sb.run_code(hang).await.unwrap();
    assert!(e.timed_out && !e.state_lost, "{e:?}");
    assert_eq!(e.error.unwrap().name, "KeyboardInterrupt");
    assert_eq!(
        text(&r("greeting").await.unwrap()).as_deref(),
        Some("'Hello World!'")
    );
    // A syntax error stays one.
    let err = r("await (1 +* 2)").await.unwrap().error.unwrap();
    assert_eq!(err.name, "SyntaxError");
}

/// A run's own variables, in context `id` of `language` whose own environment has
/// `KEPT=ctx`: `first` sees them (and what it starts does), `after` sees what was there before.
async fn check_run_env(
    sb: &Sandbox,
    language: Language,
    first: &str,
    after: &str,
) -> (String, String) {
    let id = language.as_str();
    new_context(sb, id, language, &[("KEPT", "ctx")]).await;
    let mut req = code(first, Some(id));
    req.env = vec![
        ("FOO".into(), "bar".into()),
        ("KEPT".into(), "run".into()),
        ("ODD".into(), "a b\nc=d é".into()),
    ];
    let e = sb.run_code(req).await.unwrap();
    assert!(e.error.is_none(), "{language:?}: {e:?}");
    let seen = text(&e).unwrap_or_else(|| e.logs.stdout.concat());
    let e = sb.run_code(code(after, Some(id))).await.unwrap();
    assert!(e.error.is_none(), "{language:?}: {e:?}");
    (seen, text(&e).unwrap_or_else(|| e.logs.stdout.concat()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runs_own_variables_are_set_for_that_run_only() {
    also_as_nobody(&lockbox_testkit::test_name!(
        "a_runs_own_variables_are_set_for_that_run_only"
    ));
    let state = scratch();
    let (_rt, sb) = sandbox(state.path()).await;
    let (seen, after) = check_run_env(
        &sb,
        Language::Python,
        "import os, subprocess\n\
         (os.environ['FOO'], os.environ['KEPT'], os.environ['ODD'],\n \
         subprocess.run(['sh', '-c', 'printf %s \"$FOO\"'], capture_output=True, text=True).stdout)",
        "(os.environ.get('FOO', 'default'), os.environ['KEPT'])",
    )
    .await;
    assert_eq!(seen, "('bar', 'run', 'a b\\nc=d é', 'bar')");
    assert_eq!(after, "('default', 'ctx')");

    let (seen, after) = check_run_env(
        &sb,
        Language::Bash,
        "LOCAL=mine; echo \"$FOO|$KEPT|$ODD\"; sh -c 'echo \"$FOO\"'",
        "echo \"${FOO:-default}|$KEPT\"",
    )
    .await;
    assert_eq!(seen, "bar|run|a b\nc=d é\nbar\n");
    assert_eq!(after, "default|ctx\n");
    // A shell variable that was not exported is given back unexported; an interrupted run
    // gives its variables back too.
    let mut req = code("sleep 100", Some("bash"));
    req.env = vec![("LOCAL".into(), "run".into()), ("FOO".into(), "x".into())];
    req.timeout = Some(Duration::from_millis(300));
    let e = sb.run_code(req).await.unwrap();
    assert!(e.timed_out && !e.state_lost, "{e:?}");
    let e = sb
        .run_code(code(
            "declare -p LOCAL; echo \"${FOO-unset}\"",
            Some("bash"),
        ))
        .await
        .unwrap();
    assert_eq!(e.logs.stdout.concat(), "declare -- LOCAL=\"mine\"\nunset\n");

    if std::path::Path::new("/usr/bin/node").exists() {
        let (seen, after) = check_run_env(
            &sb,
            Language::Node,
            "[process.env.FOO, process.env.KEPT, process.env.ODD].join('|')",
            "(process.env.FOO || 'default') + '|' + process.env.KEPT",
        )
        .await;
        assert_eq!(seen, "'bar|run|a b\\nc=d é'");
        assert_eq!(after, "'default|ctx'");
    }

    // Names every runner can set, values an environment can hold.
    for (name, value) in [("1X", "a"), ("A-B", "a"), ("", "a"), ("A", "a\0b")] {
        let mut req = code("1", None);
        req.env = vec![(name.into(), value.into())];
        let err = sb.run_code(req).await.unwrap_err();
        assert_eq!(err.code().as_str(), "INVALID_REQUEST", "{name:?}: {err}");
        assert!(err.to_string().contains("env"), "{err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_context_requests_name_what_is_wrong() {
    let state = scratch();
    let (_rt, sb) = sandbox(state.path()).await;
    let err = sb.run_code(code("1", Some("nope"))).await.unwrap_err();
    assert_eq!(err.code().as_str(), "CONTEXT_NOT_FOUND");
    let err = sb.delete_context("nope").await.unwrap_err();
    assert_eq!(err.code().as_str(), "CONTEXT_NOT_FOUND");
    let opts = ContextOptions {
        id: Some("twice".into()),
        ..ContextOptions::default()
    };
    sb.create_context(opts.clone()).await.unwrap();
    let err = sb.create_context(opts).await.unwrap_err();
    assert_eq!(err.code().as_str(), "ALREADY_EXISTS");
}

/// Issue 32: a run printing 20 MiB of `\x01` per stream made a 201 MB JSON reply (each
/// byte is 6 in JSON, `\u0001`) and +230 MB of server memory. What a run keeps is now
/// bounded in JSON bytes: `max_exec_output` per stream, as much for results and error
/// together, and the run says it was cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue_32_a_run_keeps_at_most_its_cap_of_json_per_stream_results_and_error() {
    also_as_nobody(&lockbox_testkit::test_name!(
        "issue_32_a_run_keeps_at_most_its_cap_of_json_per_stream_results_and_error"
    ));
    let state = scratch();
    let (_rt, sb) = sandbox(state.path()).await;
    let max = lockbox_runtime::DEFAULT_MAX_EXEC_OUTPUT;
    let e = run(
        &sb,
        "import sys\nfor s in (sys.stdout, sys.stderr):\n    s.write('\\x01' * (20 << 20)); s.flush()",
    )
    .await;
    assert!(e.truncated && e.error.is_none(), "{:?}", e.error);
    for (name, logs) in [("stdout", &e.logs.stdout), ("stderr", &e.logs.stderr)] {
        let size = json(logs);
        // As much as fits is kept: a chunk at most (64 KiB) short of the cap.
        assert!(
            size <= max + 4096 && size > max - (1 << 20),
            "{name}: {size}"
        );
    }
    let e = run(
        &sb,
        // Each below the runner's own bound of 64 MiB per event (in JSON, as here).
        "class Big:\n    def __repr__(self): return '\\x01' * (8 << 20)\n\
         display(Big())\nraise ValueError('\\x01' * (4 << 20))",
    )
    .await;
    assert!(e.truncated, "{:?}", e.results.len());
    assert!(
        e.results.is_empty(),
        "48 MiB of JSON does not fit in 16 MiB"
    );
    let error = e.error.as_ref().unwrap();
    assert_eq!(error.name, "ValueError");
    assert!(json(error) <= max + 4096, "{}", json(error));
    assert!(error.value.starts_with('\x01'));
}

/// The size of `v` in JSON.
fn json<T: serde::Serialize + ?Sized>(v: &T) -> usize {
    serde_json::to_vec(v).unwrap().len()
}
