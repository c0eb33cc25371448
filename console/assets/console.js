// omnibus console: refreshes the overview's figures in place and selects
// every row of a page. No framework, nothing loaded from elsewhere.
"use strict";
document.addEventListener("DOMContentLoaded", function () {
  var live = document.querySelector("[data-live]");
  if (live) {
    var every = Number(live.dataset.refresh) || 5000;
    var busy = false;
    setInterval(function () {
      if (busy) { return; }
      busy = true;
      fetch(live.dataset.live, { credentials: "same-origin", cache: "no-store" })
        .then(function (r) { return r.ok ? r.text() : Promise.reject(r.status); })
        .then(function (html) {
          live.innerHTML = html;
          live.dataset.updates = String(Number(live.dataset.updates || "0") + 1);
          live.classList.remove("stale");
        })
        .catch(function () { live.classList.add("stale"); })
        .finally(function () { busy = false; });
    }, every);
  }
  var all = document.getElementById("select-all");
  if (all) {
    all.addEventListener("change", function () {
      document.querySelectorAll("#selection input[name=id]").forEach(function (box) { box.checked = all.checked; });
    });
  }
});
