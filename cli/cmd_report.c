/*
 * rk report RUN_DIR [-o report.html]: a run at a glance (docs/report.md). Parse, then one
 * library call (src/report/report.h: read the run's records, render, write atomically),
 * then one line saying what the page holds.
 */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "args.h"
#include "report/report.h"
#include "rk.h"

static const char usage_text[] =
    "usage: rk report RUN_DIR [-o FILE]\n"
    "\n"
    "Write one self-contained HTML page (inline SVG, no script, nothing fetched) showing a\n"
    "run of rk run: the loss by step with every incident marked, goodput over time, which\n"
    "rank ran on which device in each launch, each GPU's health score and temperature,\n"
    "the checkpoints, and a table of the incidents. RUN_DIR holds what rk run and rk train\n"
    "wrote (each optional, but events.jsonl, steps.jsonl or loss.log needed):\n"
    "  events.jsonl  rk run --events        summary.json  rk run --summary-json\n"
    "  steps.jsonl   rk run --steps         gate.jsonl    rk run --gate-log\n"
    "  metrics.json  rk train --metrics-json\n"
    "  loss.log      rk train --loss-log (read without steps.jsonl: rk train alone)\n"
    "\n"
    "  -o, --output FILE  the page to write, atomically (default: RUN_DIR/report.html)\n"
    "  -h, --help         show this help\n"
    "\n"
    "Past its limits (docs/report.md) the page samples or caps what it draws, and says so;\n"
    "a file larger than its bound is refused.\n"
    "Exit status: 0 written, 2 bad usage or a file that cannot be read (nothing written).\n"
    "See docs/report.md.\n";

int rk_cmd_report(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"output", required_argument, 0, 'o'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    rk_args args = {.cmd = "report", .usage = usage_text};
    const char *out = NULL;
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "o:h", longopts, NULL)) != -1) {
        switch (c) {
        case 'o': out = optarg; break;
        case 'h': fputs(usage_text, stdout); return RK_EXIT_OK;
        default:
            return rk_cli_usage_error("report", usage_text, "%s",
                                      optopt ? "an option needs a value, or is unknown"
                                             : "unknown option");
        }
    }
    if (optind >= argc)
        return rk_cli_usage_error("report", usage_text, "no RUN_DIR given");
    if (argc - optind > 1)
        return rk_cli_usage_error("report", usage_text, "one RUN_DIR only (got '%s' too)",
                                  argv[optind + 1]);
    const char *dir = argv[optind];
    if (rk_arg_path(&args, "RUN_DIR", dir, RK_PATH_DIR))
        return RK_EXIT_USAGE;
    char def[4200];
    if (!out) {
        if ((size_t)snprintf(def, sizeof def, "%s/report.html", dir) >= sizeof def)
            return rk_cli_usage_error("report", usage_text, "RUN_DIR is too long");
        out = def;
    }
    if (rk_arg_path(&args, "--output", out, RK_PATH_OUTPUT))
        return RK_EXIT_USAGE;
    rk_report_stats st;
    rk_err err = {0};
    if (rk_report_write(dir, out, &st, &err)) {
        fprintf(stderr, "rk report: %s\n", err.msg);
        return err.code == RK_EIO || err.code == RK_ENOMEM ? RK_EXIT_FAIL : RK_EXIT_USAGE;
    }
    printf("rk report: %s: %ld incident%s marked, %ld fault%s injected, %ld step records in %ld "
           "launch%s, %ld checkpoint%s, %ld GPU%s read%s\n",
           out, st.incidents, st.incidents == 1 ? "" : "s", st.injections,
           st.injections == 1 ? "" : "s", st.steps, st.launches, st.launches == 1 ? "" : "es",
           st.ckpts, st.ckpts == 1 ? "" : "s", st.gpus, st.gpus == 1 ? "" : "s",
           st.simulated ? " (simulated)" : "");
    if (st.left_out)
        fprintf(stderr, "rk report: the run holds more than the page's limits: it says what it "
                        "left out (docs/report.md, \"Limits\")\n");
    if (st.torn)
        fprintf(stderr, "rk report: %d file%s ended in a cut line (left out)\n", st.torn,
                st.torn == 1 ? "" : "s");
    return RK_EXIT_OK;
}
