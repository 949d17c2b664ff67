"""The proof runs what the lab runs: gpu_check's rows for ddp_dali on the kit's PNG tree
(--dali-source files, `mixed` decode on a GPU) on 1 and 2 GPUs, on a tree it writes on the fly,
and the lab-style driver (scripts/kit_driver.py: the lab's functions called as the kit's
train_cifar.py calls them) over NCCL on 2 GPUs. CI's rehearsal step (.ci/run) runs every row of
the plan end to end on the CPU, these included, and checks that the tree made on the fly is gone;
the main suite keeps to the plan and the listing, which take seconds."""
from scripts import gpu_check
from scripts.gpu_check_rehearse import rehearse

FILES_1, FILES_2 = "ddp_dali files (PNG tree; mixed decode)", "2 GPUs: ddp_dali files (PNG tree; mixed decode)"
DRIVERS = ("2 GPUs: lab-style driver: ddp over NCCL", "2 GPUs: lab-style driver: ddp_dali over NCCL")


def names(checks):
    return {c.name: c for c in checks}


def test_the_plan_runs_the_labs_png_tree_path_on_one_and_two_gpus_and_the_lab_style_driver_on_nccl():
    one, two = names(gpu_check.plan(1, dali=True, nsys=True, pytest_ok=True)), \
        names(gpu_check.plan(2, dali=True, nsys=True, pytest_ok=True))
    assert FILES_1 in one and not any(name in one for name in (FILES_2, *DRIVERS))
    for name, gpus in ((FILES_1, 1), (FILES_2, 2)):
        check = two[name]
        assert check.kind == "tree" and check.gpus == gpus and check.args[:2] == ("--num_gpu", str(gpus))
        assert ("--dali-source", "files") == check.args[check.args.index("--dali-source"):][:2]
        assert ("config.dali_source", "files") in check.expect
    for name, mode in zip(DRIVERS, ("ddp", "ddp_dali")):
        assert two[name].kind == "driver" and two[name].args == ("--mode", mode, "--num_gpu", "2")
        assert two[name].expect == (("env.backend", "nccl"),)
    no_dali = names(gpu_check.plan(2, dali=False, nsys=True, pytest_ok=True))
    assert all("DALI" in no_dali[n].skip for n in (FILES_1, FILES_2, DRIVERS[1])) and not no_dali[DRIVERS[0]].skip
    rehearsed = names(rehearse(list(two.values())))
    assert all(rehearsed[n].expect == (("env.backend", "gloo"),) for n in DRIVERS)


def test_rehearse_lists_the_new_rows(monkeypatch, capsys, tmp_path, nsys_turn):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # main sets it for --rehearse; restored after
    assert gpu_check.main(["--rehearse", "--list", "--no-tests", "--out", str(tmp_path)]) == 0
    listed = [line.split(" s  ", 1)[1] for line in capsys.readouterr().out.splitlines() if " s  " in line]
    assert {FILES_1, FILES_2, *DRIVERS} <= set(listed)
