"""The `pipeplan show` commands: a profile or a cluster as tables, JSON or a bandwidth heat map."""

from __future__ import annotations

from pathlib import Path

import typer

from pipeplan.viz.json_print import print_json

show_app = typer.Typer(
    name="show",
    help="Show a model profile or a cluster (a built-in name or a file), or list the built-ins.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@show_app.command("profile")
def show_profile(
    spec: str = typer.Argument(..., help="Built-in name (see `pipeplan show profiles`), a .json profile or a graph.txt file."),
    as_json: bool = typer.Option(False, "--json", help="Print the profile as pipeplan.profile/1 JSON."),
    profile_batch_size: int | None = typer.Option(
        None, "--profile-batch-size", help="Batch the graph.txt was measured with, when its name has no -pbs-N."
    ),
) -> None:
    """Per-layer costs of a model: times (ms), activation, parameter and cut sizes."""
    from pipeplan.api.arguments import profile_of
    from pipeplan.viz.inventory import print_profile_layers, profile_summary

    profile = profile_of(spec, profile_batch_size)
    if as_json:
        from pipeplan.io.profile_json import profile_to_json

        print_json(profile_to_json(profile), compact=True)
        return
    from pipeplan.viz.tables import wide_console  # rich loads only when a table prints

    console = wide_console()
    console.print(profile_summary(profile))
    print_profile_layers(console, profile)


@show_app.command("cluster")
def show_cluster(
    spec: str = typer.Argument(..., help="Built-in name (see `pipeplan show clusters`) or a .json cluster file."),
    as_json: bool = typer.Option(False, "--json", help="Print the cluster in matrix form (GB/s, us, GiB)."),
    png: str | None = typer.Option(None, "--png", help="Write the bandwidth matrix as a heat map PNG."),
) -> None:
    """Devices of a cluster and the bandwidth and latency between them."""
    from pipeplan.api.arguments import load_cluster
    from pipeplan.cli.declared_files import check_files
    from pipeplan.viz.inventory import MATRIX_MAX_DEVICES, bandwidth_matrix_table, devices_table, link_classes_table

    check_files()
    cluster = load_cluster(spec)
    if png is not None:
        from pipeplan.viz.heatmap import draw_bandwidth_heatmap

        draw_bandwidth_heatmap(cluster, Path(png))
    if as_json:
        from pipeplan.io.cluster_json import cluster_to_json

        print_json(cluster_to_json(cluster), compact=True)
        return
    from pipeplan.viz.tables import wide_console  # rich loads only when a table prints

    console = wide_console()
    console.print(devices_table(cluster))
    console.print(link_classes_table(cluster))
    if cluster.num_devices <= MATRIX_MAX_DEVICES:
        console.print(bandwidth_matrix_table(cluster))
    if png is not None:
        console.print(f"wrote {png}")


@show_app.command("profiles")
def show_profiles(as_json: bool = typer.Option(False, "--json", help="Print the list as JSON.")) -> None:
    """List the built-in profiles with their sizes and totals."""
    from pipeplan.api.catalog import builtin_profiles
    from pipeplan.viz.inventory import profiles_list_table

    rows = builtin_profiles()
    if as_json:
        print_json({"profiles": rows}, compact=True)
        return
    from pipeplan.viz.tables import wide_console  # rich loads only when a table prints

    wide_console(100).print(profiles_list_table(rows))


@show_app.command("clusters")
def show_clusters(as_json: bool = typer.Option(False, "--json", help="Print the list as JSON.")) -> None:
    """List the built-in clusters."""
    from pipeplan.api.catalog import builtin_clusters
    from pipeplan.viz.inventory import clusters_list_table

    rows = builtin_clusters()
    if as_json:
        print_json({"clusters": rows}, compact=True)
        return
    from pipeplan.viz.tables import wide_console  # rich loads only when a table prints

    wide_console(140).print(clusters_list_table(rows))


def register(app: typer.Typer) -> None:
    """Add the `show` command group to app."""
    app.add_typer(show_app, name="show")
