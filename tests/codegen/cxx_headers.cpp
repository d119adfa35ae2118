// The generated headers as a C++ program sees them (test_codegen_cxx_headers
// compiles this with -fsyntax-only -Werror): extern "C", no C-only syntax in
// declarations, impl structs of unary and streaming methods usable from C++.
#include "kw/keywords.vrpc.h"
#include "odd/odd_names.vrpc.h"
#include "shop/shop.vrpc.h"
#include "stream/feeds.vrpc.h"

int main()
{
    Cg__Stream__V1__Ticker_VrpcImpl ticker = {};
    Cg__Stream__V1__Ticker_Trade_Async trade = {};
    Int__Switch__Static__Void_VrpcImpl kw = {};

    (void)ticker.subscribe.start;
    (void)trade.on_read;
    (void)kw.return_;
    return cg__stream__v1__ticker__trade__method.kind == VRPC_METHOD_BIDI_STREAMING ? 0 : 1;
}
