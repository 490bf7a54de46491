"""examples/particle_mesh.py runs, prints what its docstring says, and equals one device."""

import ast
import pathlib
import runpy

import numpy as np

EXAMPLE = pathlib.Path(__file__).resolve().parent.parent / "examples" / "particle_mesh.py"


def test_particle_mesh_example(capsys):
    ns = runpy.run_path(str(EXAMPLE), run_name="example")
    result = ns["main"]()
    out = capsys.readouterr().out
    doc = ast.get_docstring(ast.parse(EXAMPLE.read_text()))
    expected = [line.strip() for line in doc.split("Expected output:\n", 1)[1].strip().splitlines()]
    assert [line.strip() for line in out.strip().splitlines()] == expected
    # the paint and the read-out equal numpy's on one device (float32 vs float64)
    assert result["paint_err"] < 1e-5 and result["read_err"] < 1e-5
    # and the shard edges matter: many particles deposit into a neighbour's cells
    pos = ns["make_particles"]()
    lx, ly = ns["N"] // ns["MESH"][0], ns["N"] // ns["MESH"][1]
    crossing = (pos[..., 0] % lx > lx - 1) | (pos[..., 1] % ly > ly - 1)
    assert crossing.sum() > 500
    rho_ref, _ = ns["one_device"](pos)
    np.testing.assert_allclose(np.asarray(result["rho"]), rho_ref, atol=1e-5)
