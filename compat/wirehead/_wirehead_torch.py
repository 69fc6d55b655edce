"""Marks this ``wirehead`` package as wirehead_torch's compatibility
package (``wirehead-torch --version`` looks for this file), and says what
to do when wirehead_torch itself is missing."""

MISSING = (
    "the `wirehead` package installed here is wirehead_torch's compatibility package (it "
    "replaced the original wirehead distribution), and wirehead_torch is not installed. "
    "Install wirehead_torch (pip install wirehead_torch-*.whl, or pip install . in its "
    "checkout), or go back to the original wirehead: pip uninstall wirehead, then install "
    "the original (pip install wirehead)")


def require():
    """Imports wirehead_torch; raises ImportError with MISSING if it is not
    installed (any other import failure is raised as it is)."""
    try:
        import wirehead_torch  # noqa: F401
    except ModuleNotFoundError as e:
        if e.name != "wirehead_torch":
            raise
        raise ImportError(MISSING, name="wirehead_torch") from None
