"""Repository rule exposing Debian system libraries found by pkg-config.

Each entry of `libs` becomes one cc_library named after the key, whose
linkopts, defines and include dirs come from `pkg-config --cflags --libs`
run when the repository is fetched. A missing module fails the fetch with a
message naming the Debian -dev package to install.
"""

def _pkg_config(ctx, args):
    res = ctx.execute(["pkg-config"] + args)
    if res.return_code != 0:
        return None
    return res.stdout.strip()

def _system_libs_impl(ctx):
    build = ['package(default_visibility = ["//visibility:public"])', ""]
    for name, spec in ctx.attr.libs.items():
        modules, _, package = spec.partition("|")
        mods = modules.split(" ")
        cflags = _pkg_config(ctx, ["--cflags"] + mods)
        libs = _pkg_config(ctx, ["--libs"] + mods)
        if cflags == None or libs == None:
            fail("pkg-config cannot find '%s': install the Debian package %s (apt-get install %s)" % (modules, package, package))
        linkopts = []
        defines = []
        includes = []
        for tok in (cflags + " " + libs).split(" "):
            if tok == "":
                continue
            if tok.startswith("-D"):
                defines.append(tok[2:])
            elif tok.startswith("-I"):
                d = tok[2:].rstrip("/")
                if d in ["/usr/include", "/usr/local/include"]:
                    continue
                link = "inc_%s_%d" % (name, len(includes))
                ctx.symlink(d, link)
                includes.append(link)
            elif tok.startswith("-l") or tok.startswith("-L") or tok.startswith("-Wl") or tok == "-pthread":
                if tok not in linkopts:
                    linkopts.append(tok)
        hdrs = []
        build.append("cc_library(")
        build.append("    name = %r," % name)
        build.append("    hdrs = glob([%s], allow_empty = True)," % ", ".join(["%r" % (i + "/**") for i in includes]))
        build.append("    includes = %r," % includes)
        build.append("    defines = %r," % defines)
        build.append("    linkopts = %r," % linkopts)
        build.append(")")
        build.append("")
    ctx.file("WORKSPACE", "")
    ctx.file("BUILD.bazel", "\n".join(build))

system_libs = repository_rule(
    implementation = _system_libs_impl,
    attrs = {
        # name -> "pkg-config modules|debian-package"
        "libs": attr.string_dict(mandatory = True),
    },
    local = True,
)
