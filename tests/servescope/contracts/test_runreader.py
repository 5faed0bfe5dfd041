"""servescope/contracts/runreader.py: the analytic engine it reads through."""

import subprocess
import sys

from servescope.contracts import runreader


def test_the_engine_connects_runs_sql_and_names_its_errors():
    duckdb = runreader.engine()
    con = duckdb.connect(":memory:", config={"threads": 1})
    assert con.execute("SELECT 41 + 1").fetchone() == (42,)
    assert con.execute("SELECT 1.5 AS x").fetchnumpy()["x"].tolist() == [1.5]
    assert issubclass(duckdb.InvalidInputException, duckdb.Error)
    assert duckdb.__version__


def test_reading_a_run_does_not_build_duckdbs_python_layer_where_its_extension_stands_alone(tmp_path):
    # duckdb 2's `import duckdb` builds a relational API in Python that no reader uses: most of the import's cost.
    (tmp_path / "requests.jsonl").write_text("")
    code = (
        "import importlib.util, sys\n"
        "from servescope.contracts import runreader\n"
        f"runreader.RunData({str(tmp_path)!r})\n"
        "print(importlib.util.find_spec('_duckdb') is not None, 'duckdb' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    alone, package_loaded = done.stdout.split()
    assert package_loaded == ("False" if alone == "True" else "True"), done.stdout
