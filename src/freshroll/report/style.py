"""The report's inline stylesheet (no external CSS, fonts or images)."""

CSS = """
body{font:14px/1.45 -apple-system,'Segoe UI',Roboto,Helvetica,Arial,sans-serif;color:#222;
  margin:0;background:#f6f7f9}
main{max-width:1240px;margin:0 auto;padding:20px 28px 60px}
h1{font-size:22px;margin:4px 0 2px}h1 small{font-weight:normal;color:#666;font-size:14px}
h2{font-size:17px;margin:30px 0 8px;padding-bottom:4px;border-bottom:1px solid #dde}
nav{font-size:13px;margin:6px 0 14px}nav a{margin-right:12px;color:#1f5fa8;text-decoration:none}
.cards{display:flex;flex-wrap:wrap;gap:10px;margin:12px 0}
.card{background:#fff;border:1px solid #e1e4e8;border-radius:6px;padding:8px 14px;min-width:150px}
.card .k{font-size:12px;color:#666}.card .v{font-size:20px;font-weight:600;white-space:nowrap}
.card .base{font-size:12px;color:#b35900;white-space:nowrap}
.card.good{border-color:#7bc28a}.card.bad{border-color:#e0837a}
.verdict{border-radius:6px;padding:10px 14px;margin:10px 0}
.verdict span{font-size:12px;color:#444}
.ok{background:#e8f6ec;border:1px solid #7cc48d;color:#155724}
.fail{background:#fdecea;border:1px solid #e0837a;color:#8a1c12}
.fail code{font-size:12px;color:#5a120b}
.warn{background:#fff8e1;border:1px solid #e0c060;color:#6d5200}
.notes{font-size:12px;color:#8a6d00;margin:4px 0}
.row{display:flex;gap:18px;align-items:flex-start;flex-wrap:wrap}
.row .plot{max-width:660px}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(460px,1fr));gap:14px}
.plot{max-width:100%;width:fit-content;background:#fff;border:1px solid #e1e4e8;
  border-radius:6px;margin:0;display:block;overflow:hidden}
.plot svg{display:block;max-width:100%;height:auto}
.nodata{background:#fff;border:1px dashed #bbb;border-radius:6px;padding:40px 16px;
  text-align:center;color:#888}
.nodata span{font-size:12px}
.hint{font-size:12px;color:#666;margin:2px 0 8px}
table{border-collapse:collapse;background:#fff;margin:10px 0;font-size:13px}
th,td{border:1px solid #e1e4e8;padding:4px 10px;text-align:left}
th{background:#f0f2f5}table.num td+td{text-align:right;font-variant-numeric:tabular-nums}
table.kv td+td{font-variant-numeric:tabular-nums}
details.block{margin:2px 0}details.block>summary{cursor:pointer;font-size:13px;padding:2px 0}
.tag{font-size:11px;background:#eef;color:#335;border-radius:3px;padding:0 4px}
pre{background:#fff;border:1px solid #e1e4e8;border-radius:6px;padding:10px 14px;
  overflow-x:auto;font-size:12px}
"""
