// `--watch`: a view redrawn in place every interval, as watch(1) and top(1) do: on the
// terminal's alternate screen, each line cut to the terminal's width and the view to its
// height, redrawn at once when the terminal is resized, and put back as it was on q, Ctrl-C or
// SIGTERM. A terminal too small for anything says so instead.
#pragma once

#include <functional>
#include <string>

namespace muster::rendezvous {

// `render(width)` gives the whole view for a terminal `width` columns wide (it is called on
// this thread, once each redraw). Returns the exit code: 0 after q, 130 after Ctrl-C, 143
// after SIGTERM. Without a terminal on stdout it prints the view once a interval, separated
// by a blank line, until a signal.
int watchScreen(const std::function<std::string(int width)>& render, double intervalS);

}  // namespace muster::rendezvous
