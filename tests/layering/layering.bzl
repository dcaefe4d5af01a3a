"""package_deps_query: the transitive dependencies of every library and
binary of the calling package, for tests/layering/layering_test.sh.

Call it last in a package's BUILD.bazel: native.existing_rules() then holds
every rule the package defines, so a library added later is covered
without editing the test."""

def package_deps_query(name = "layering_deps"):
    labels = sorted([
        "//%s:%s" % (native.package_name(), r["name"])
        for r in native.existing_rules().values()
        if r["kind"] in ("cc_library", "cc_binary") and not r.get("testonly")
    ])
    native.genquery(
        name = name,
        expression = "deps(%s)" % " + ".join(labels),
        scope = labels,
        visibility = ["//tests/layering:__pkg__"],
    )
