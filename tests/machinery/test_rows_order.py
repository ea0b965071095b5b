"""The order rules of rows.ROWS, checked instead of written as comments."""
from fxguard.machinery.per_thread_globals import PerThread
from fxguard.torch_support import rows
from fxguard.torch_support.compile_lock import SharedLockRow
from fxguard.torch_support.options import Option


def test_a_row_comes_after_every_row_whose_value_it_needs():
    provided: dict[str, int] = {}
    for index, row in enumerate(rows.ROWS):
        missing = [name for name in row.needs if name not in provided]
        assert missing == [], f"{row.what} needs {missing}, provided by no earlier row"
        for name in row.provides:
            assert name not in provided, f"{name} provided by rows {provided[name]} and {index}"
            provided[name] = index


def test_per_thread_globals_first_and_the_compile_lock_last():
    """The other rows wrap the code the per-thread globals leave; once the
    compile lock opens, compiles overlap."""
    kinds = [isinstance(row, PerThread) for row in rows.ROWS]
    assert kinds == sorted(kinds, reverse=True), "a per-thread global after another kind of row"
    assert isinstance(rows.ROWS[-1], SharedLockRow)
    assert sum(isinstance(row, SharedLockRow) for row in rows.ROWS) == 1


def test_every_row_names_its_option_by_the_enum():
    assert {type(row.option) for row in rows.ROWS} <= {Option, type(None)}
