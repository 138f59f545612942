"""Python's exception map covers every error code lockbox has (``lockbox_policy::ErrorCode``,
listed by the native module): each code of the native layers becomes an exception of its
own family, and every code Python names exists in Rust."""

from lockbox import _lockbox, errors

#: The family a native error reaches Python through (branch errors come with transactions).
THROUGH = {"policy": "policy", "setup": "setup", "cow": "txn", "txn": "txn", "journal": "journal"}
BASE = {
    "policy": errors.PolicyError,
    "setup": (errors.SetupError, errors.PolicyError),
    "txn": errors.TxnError,
    "journal": errors.JournalError,
}


def test_every_code_of_the_native_layers_maps_to_an_exception_of_its_family():
    codes = _lockbox.error_codes()
    assert len(codes) > 100 and len({c for c, _ in codes}) == len(codes)
    for code, family in codes:
        if family not in THROUGH:
            continue  # runtime and server codes reach Python as ServerError(code=...)
        through = THROUGH[family]
        exc = errors._from_rust(through, code, "message", None, "")
        assert type(exc) is not errors.LockboxError, code
        assert isinstance(exc, BASE[through]), (code, type(exc))
        assert exc.code == code


def test_every_code_python_names_exists_in_rust():
    known = {c for c, _ in _lockbox.error_codes()}
    assert set(errors._BY_CODE) <= known, set(errors._BY_CODE) - known


def test_a_stale_review_is_a_commit_error_of_its_own():
    exc = errors._from_rust("txn", "STALE_REVIEW", "stale review: 'f'", None, "")
    assert type(exc) is errors.StaleReviewError and isinstance(exc, errors.CommitError)
