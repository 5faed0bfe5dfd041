"""servescope/report/query.py: per-request columns as plain arrays, NULLs read as NaN or None."""

import math
import subprocess
import sys

import numpy as np

from servescope.contracts import runreader
from servescope.report import query


def test_a_column_with_nulls_reads_them_as_nan_for_numbers_and_none_otherwise():
    con = runreader.engine().connect(":memory:")
    con.execute("CREATE TABLE requests (seq INTEGER, x DOUBLE, n INTEGER, s VARCHAR)")
    con.execute("INSERT INTO requests VALUES (2, NULL, 3, 'b'), (1, 1.5, NULL, NULL)")
    x, n, s = (query.column(con, c) for c in ("x", "n", "s"))
    assert x[0] == 1.5 and math.isnan(x[1])
    assert n.dtype.kind == "f" and math.isnan(n[0]) and n[1] == 3
    assert s.tolist() == [None, "b"]
    assert not isinstance(x, np.ma.MaskedArray)


def test_a_plain_array_passes_as_it_is():
    values = np.array([1.0, 2.0])
    assert query.plain(values) is values or np.array_equal(query.plain(values), values)


def test_a_column_without_a_null_does_not_load_numpy_ma():
    # numpy.ma is a fortieth of a short run's CPU: asked for only where the engine made a masked array.
    code = (
        "import sys\n"
        "from servescope.contracts import runreader\n"
        "from servescope.report import query\n"
        "con = runreader.engine().connect(':memory:')\n"
        "con.execute('CREATE TABLE requests (seq INTEGER, x DOUBLE)')\n"
        "con.execute('INSERT INTO requests VALUES (1, 1.0), (2, 2.0)')\n"
        "print(query.column(con, 'x').tolist(), 'numpy.ma' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split("]")[-1].strip() == "False", done.stdout
